"""The curation config (one dataclass of the stages' configs, read from TOML) and the stages it builds, in order.

    text_field = "text"                    # JSONL / parquet inputs
    skip = ["repetition"]                  # stages left out, by name
    [language]    languages = ["en"], threshold = 0.65
    [gopher]      min_words = 50, ...
    [quality]     path = "quality.npz", threshold = 0.5          # a classifier trained with gptlab.curate.classifier
    [[fasttext]]  path = "nsfw.bin", label = "__label__nsfw", threshold = 0.5, keep_if = "below"
    [minhash]     ngram = 5, num_hashes = 128, bands = 16, threshold = 0.8
    [output]      format = "jsonl", shard_documents = 100000

docs/curate.toml lists every setting with its default. Per-document stages, in this order: extract, language,
gopher, repetition, quality (only with a classifier), fastText filters (one per [[fasttext]]), pii; then the corpus-
wide ones: exact_dedup, minhash, line_dedup. Not here: running them (gptlab.curate.pipeline).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.curate.classifier import FastTextConfig, FastTextFilter, QualityFilter, QualityFilterConfig
from gptlab.curate.dedup import (
    DocumentDeduplicationConfig,
    DocumentDeduplicator,
    LineDeduplicationConfig,
    LineDeduplicator,
    MinHashDeduplicator,
)
from gptlab.curate.document import Stage
from gptlab.curate.extract import Extract, ExtractConfig
from gptlab.curate.language import LanguageConfig, LanguageFilter
from gptlab.curate.minhash import MinHashConfig
from gptlab.curate.pii import PIIConfig, PIIMasker
from gptlab.curate.quality import GopherConfig, GopherFilter, RepetitionConfig, RepetitionFilter
from gptlab.runtime import GptlabError
from gptlab.runtime.config import build_config

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

DOCUMENT_STAGES = ("extract", "language", "gopher", "repetition", "quality", "fasttext", "pii")
# Whole documents first, then lines: line dedup removes every copy of a repeated line, so run first it would empty
# both copies of a duplicated page instead of keeping one.
CORPUS_STAGES = ("exact_dedup", "minhash", "line_dedup")
FORMATS = ("jsonl", "parquet")


@dataclass(frozen=True, kw_only=True)
class OutputConfig:
    format: str = "jsonl"  # jsonl | parquet: what `gptlab data prepare` reads
    shard_documents: int = 100_000  # documents per output shard

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise GptlabError(f"output.format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.shard_documents < 1:
            raise GptlabError(f"output.shard_documents must be at least 1, got {self.shard_documents}")


@dataclass(frozen=True, kw_only=True)
class CurateConfig:
    text_field: str = "text"  # JSONL / parquet: the field holding the text
    id_field: str = "id"  # JSONL / parquet: the field holding an id (else file/line)
    skip: tuple[str, ...] = ()  # stages to leave out, by name (DOCUMENT_STAGES, CORPUS_STAGES)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    language: LanguageConfig = field(default_factory=LanguageConfig)
    gopher: GopherConfig = field(default_factory=GopherConfig)
    repetition: RepetitionConfig = field(default_factory=RepetitionConfig)
    quality: QualityFilterConfig = field(default_factory=QualityFilterConfig)  # path "": no classifier
    fasttext: tuple[FastTextConfig, ...] = ()  # user-provided fastText classifiers (e.g. NSFW, toxicity)
    pii: PIIConfig = field(default_factory=PIIConfig)
    line_dedup: LineDeduplicationConfig = field(default_factory=LineDeduplicationConfig)
    exact_dedup: DocumentDeduplicationConfig = field(default_factory=DocumentDeduplicationConfig)
    minhash: MinHashConfig = field(default_factory=MinHashConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.skip) - set(DOCUMENT_STAGES) - set(CORPUS_STAGES))
        if unknown:
            raise GptlabError(f"skip names unknown stages {', '.join(unknown)}; stages: {', '.join(DOCUMENT_STAGES + CORPUS_STAGES)}")
        if set(DOCUMENT_STAGES + CORPUS_STAGES) <= set(self.skip):
            raise GptlabError("skip leaves out every stage: nothing would be curated; drop some names from skip")


def load_config(path: str | None) -> CurateConfig:
    """The config in a TOML file (every key optional), or the defaults; unknown keys are errors naming them."""
    if not path:
        return CurateConfig()
    file = Path(path)
    if not file.is_file():
        raise GptlabError(f"--config {file}: no such file (docs/curate.toml lists every setting)")
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise GptlabError(f"--config {file} is not valid TOML: {error}") from None
    classifiers = data.pop("fasttext", [])
    if not isinstance(classifiers, list) or not all(isinstance(item, dict) for item in classifiers):
        raise GptlabError(f"--config {file}: fasttext is a list of tables: write [[fasttext]] for each classifier")
    check_types(CurateConfig, data, f"--config {file}: ")
    for item in classifiers:
        check_types(FastTextConfig, item, f"--config {file}: [[fasttext]] ")
    config = build_config(CurateConfig, data, source=str(file))
    built = tuple(build_config(FastTextConfig, item, source=f"{file} [[fasttext]]") for item in classifiers)
    return CurateConfig(**{**{name: getattr(config, name) for name in config.__dataclass_fields__}, "fasttext": built})


def check_types(cls: type, data: dict, where: str, prefix: str = "") -> None:
    """Each TOML value of the type its field declares, so a wrong one is named here ("gopher.min_words = '50' is a
    string; give an integer") rather than failing as a comparison deep inside a stage. Unknown keys are left to
    build_config, which names them."""
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        if name not in hints:
            continue
        kind, key = hints[name], f"{prefix}{name}"
        if dataclasses.is_dataclass(kind):
            if not isinstance(value, dict):
                raise GptlabError(f"{where}{key} = {_toml(value)} is {_described(value)}; write it as a table, [{key}]")
            check_types(kind, value, where, f"{key}.")
        elif typing.get_origin(kind) is tuple:
            element = typing.get_args(kind)[0]
            if not isinstance(value, list) or not all(_is(item, element) for item in value):
                raise GptlabError(f"{where}{key} = {_toml(value)} is {_described(value)}; give a list of {_PLURAL_WORDS[element]}")
        elif not _is(value, kind):
            raise GptlabError(f"{where}{key} = {_toml(value)} is {_described(value)}; give {_TYPE_WORDS[kind]}")


_TYPE_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
_PLURAL_WORDS = {str: "strings", int: "integers", float: "numbers", bool: "booleans"}
_TOML_WORDS = {bool: "a boolean", str: "a string", int: "an integer", float: "a decimal number", list: "a list", dict: "a table"}


def _is(value, kind: type) -> bool:
    """TOML's types against a field's: a bool is no number, and an integer serves where a float goes."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _toml(value) -> str:
    """A value as the TOML file wrote it: "50", true, ["en", 3] (JSON spells these the same)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def _described(value) -> str:
    return next((word for kind, word in _TOML_WORDS.items() if isinstance(value, kind)), f"a {type(value).__name__}")


def build_stages(config: CurateConfig) -> list[Stage]:
    """The per-document stages the config asks for, in pipeline order (classifier files are loaded, and checked, here)."""
    stages: list[Stage] = []
    wanted = [name for name in DOCUMENT_STAGES if name not in config.skip]
    for name in wanted:
        if name == "extract":
            stages.append(Extract(config.extract))
        elif name == "language":
            stages.append(LanguageFilter(config.language))
        elif name == "gopher":
            stages.append(GopherFilter(config.gopher))
        elif name == "repetition":
            stages.append(RepetitionFilter(config.repetition))
        elif name == "quality" and config.quality.path:
            stages.append(QualityFilter(config.quality))
        elif name == "fasttext":
            stages.extend(FastTextFilter(classifier) for classifier in config.fasttext)
        elif name == "pii":
            stages.append(PIIMasker(config.pii))
    return stages


def build_dedup(config: CurateConfig) -> list:
    """The corpus-wide passes the config asks for, in order: exact documents, MinHash, then exact lines."""
    passes = {"exact_dedup": lambda: DocumentDeduplicator(config.exact_dedup), "minhash": lambda: MinHashDeduplicator(config.minhash),
              "line_dedup": lambda: LineDeduplicator(config.line_dedup)}
    return [make() for name, make in passes.items() if name not in config.skip]
