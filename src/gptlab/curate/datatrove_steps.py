"""The curation stages as datatrove pipeline steps: the same code at cluster scale on an existing engine.

    from datatrove.executor import LocalPipelineExecutor      # or SlurmPipelineExecutor: the same pipeline
    from datatrove.pipeline.writers import JsonlWriter
    steps = [GptlabReader(files), *gptlab_steps(config), JsonlWriter("out/")]
    LocalPipelineExecutor(pipeline=steps, tasks=4, workers=2, logging_dir="logs/").run()

`GptlabReader` deals the input files across datatrove's tasks (rank r reads files r, r + world_size, ...) with
gptlab's readers; `GptlabStep` runs one per-document stage (extraction, language, Gopher, repetition, classifiers,
PII) on datatrove's Documents and counts what it drops, by reason, in datatrove's stats. Corpus-wide deduplication
is not a per-document step: at scale use datatrove's own multi-stage MinHash (signatures, buckets, clusters,
filter) on the output, or `gptlab data curate` on one machine. datatrove is optional: gptlab's `curate` extra (`make install-curate`).
Not here: the stages (the other gptlab.curate modules).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gptlab.curate.config import CurateConfig, build_stages
from gptlab.curate.document import Document, Stage
from gptlab.curate.pipeline import input_labels, relabel
from gptlab.curate.readers import expand_inputs, read_documents
from gptlab.runtime import GptlabError

try:
    from datatrove.data import Document as DatatroveDocument
    from datatrove.pipeline.base import PipelineStep
except ImportError:  # the module still imports; building a step says what to install
    PipelineStep, DatatroveDocument = object, None


def _need_datatrove() -> None:
    if DatatroveDocument is None:
        raise GptlabError("the datatrove steps need the datatrove package, from gptlab's 'curate' extra: "
                          "make install-curate (or pip install 'gptlab[curate]')")


def to_gptlab(document) -> Document:
    return Document(id=document.id, text=document.text, metadata=dict(document.metadata))


def to_datatrove(document: Document):
    metadata = {key: value for key, value in document.metadata.items() if not isinstance(value, bytes)}
    return DatatroveDocument(text=document.text, id=document.id, metadata=metadata)


class GptlabReader(PipelineStep):
    """Reads input files with gptlab's readers, rank r taking every world_size-th file; HTML stays raw for extraction."""

    name = "gptlab reader"
    type = "📖 - READER"

    def __init__(self, inputs: list[str], *, text_field: str = "text", id_field: str = "id") -> None:
        _need_datatrove()
        super().__init__()
        files = expand_inputs(inputs)
        self.files = list(zip(map(str, files), input_labels(files)))  # (path, how its document ids begin)
        self.text_field, self.id_field = text_field, id_field

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> Iterator:
        if data:
            yield from data
        for path, label in self.files[rank::world_size]:
            documents = read_documents(path, text_field=self.text_field, id_field=self.id_field)
            for document in relabel(documents, Path(path).name, label):
                self.stat_update("documents read")
                converted = DatatroveDocument(text=document.text, id=document.id, metadata=document.metadata)
                yield converted


class GptlabStep(PipelineStep):
    """One gptlab per-document stage inside a datatrove pipeline, counting kept and dropped (by reason) documents."""

    type = "🧹 - GPTLAB"

    def __init__(self, stage: Stage) -> None:
        _need_datatrove()
        super().__init__()
        self.stage = stage
        self.name = stage.name

    def run(self, data, rank: int = 0, world_size: int = 1) -> Iterator:
        for document in data:
            self.stat_update("documents in")
            before = dict(self.stage.stats.reasons)
            with self.track_time():
                result = self.stage.process(to_gptlab(document))
            if result is None:
                reason = next((r for r, n in self.stage.stats.reasons.items() if n != before.get(r, 0)), "dropped")
                self.stat_update(f"dropped: {reason}")
                continue
            self.stat_update("documents out")
            yield to_datatrove(result)


def gptlab_steps(config: CurateConfig) -> list[GptlabStep]:
    """The per-document stages of `config`, in `gptlab data curate`'s order, as datatrove steps."""
    return [GptlabStep(stage) for stage in build_stages(config)]
