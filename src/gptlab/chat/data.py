"""SFT conversations: read from files, datasets and built-in tasks, checked, mixed with epochs, split for validation.

A source is named by one string, like the data stage's:

    chats.jsonl  data/*.jsonl  chats/         JSONL in the OpenAI format, a conversation per line:
                                              {"messages": [{"role": "user", "content": "..."}, ...]}
                                              and the tools it offers, if any (OpenAI's fine-tuning shape):
                                              {"messages": [...], "tools": [{"type": "function", ...}]}
    hf:HuggingFaceTB/smol-smoltalk            a Hugging Face dataset's `messages` column (gptlab.data.sources)
    hf:/path/to/dataset                       a local dataset directory (parquet/jsonl files, or save_to_disk)
    task:arithmetic[n=5000]                   a built-in task (gptlab.chat.tasks): n examples of its train split
    task:word_problems[n=2000]                a task whose replies call tools: each conversation carries its tools

A mixture is comma-separated parts, each `SOURCE[OPTIONS][@EPOCHS]`:

    chats.jsonl                                   every conversation once per epoch
    identity.jsonl@2, hf:HuggingFaceTB/smol-smoltalk[n=10000]
                                                  identity twice, and the first 10,000 smoltalk rows once
    task:arithmetic[n=5000]@0.5, chats.jsonl      a seeded half of 5,000 arithmetic problems (redrawn each epoch)
    hf:org/name:config[split=train,column=conversations]

Options in brackets: `n` (read only the first N valid conversations; for a task, N examples), `split`
(a dataset's or task's split, default train) and `column` (a dataset's column, default messages).
Any other option of a task is its setting: `task:arithmetic[n=5000,digits=3,ops=+-]`.
`@EPOCHS` is how often the part is seen per mixture epoch, and so its weight: a part's share of the
mixture is epochs × conversations. Fractional epochs take a seeded subset. The whole epoch is
shuffled from (seed, epoch), so the order is a pure function of the seed and the position in it.

Validation: with `val_fraction` f, each file or dataset part holds out ceil(f × its conversations),
chosen by their content (`held_out`: the same set whatever the training seed, or the path the file is named by);
a task's held-out conversations are ceil(f × n) examples of its `test` split (at most the whole split).

Malformed conversations (bad JSON, no `messages`, an unknown role, empty content, no assistant turn:
the rules of gptlab.chat.format.check_messages) are named by file:line or dataset row. With
on_error="skip" they are skipped and counted, the report showing the first few; with "refuse"
the first one raises.

A conversation is a gptlab.chat.format.Conversation: its messages keep role, content, an assistant's
`tool_calls` and a tool result's `tool_call_id`, and its `tools` are the declarations it offers.

Not here: rendering and batching (gptlab.chat.format, gptlab.chat.loader), the tasks themselves
(gptlab.chat.tasks), document sources for pretraining (gptlab.data.sources).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path

import numpy as np

from gptlab.chat.format import Conversation, check_messages
from gptlab.data.sources import HuggingFaceSource, SourceOptions, find_files
from gptlab.runtime import GptlabError

ON_ERROR = ("skip", "refuse")
SHOWN_PROBLEMS = 5  # malformed conversations a report lists; the rest are only counted
SHOWN_REASONS = 3  # reasons an error for a mixture with no valid rows quotes; the rest are counted
OPTIONS = ("n", "split", "column")
_PART = re.compile(r"^(?P<source>[^\[\]@]+?)\s*(\[(?P<options>[^\]]*)\])?\s*(@(?P<epochs>[^@\[\]]+))?$")
KEPT_FIELDS = ("role", "content", "tool_calls", "tool_call_id")  # of each message; others (e.g. "weight") are dropped


@dataclass(frozen=True, kw_only=True)
class PartConfig:
    """One source of a mixture."""

    source: str  # a file, glob or folder of .jsonl, hf:NAME[:CONFIG], hf:/local/dir or task:NAME
    epochs: float = 1.0  # passes per mixture epoch; a fraction takes a seeded subset
    n: int | None = None  # only the first n valid conversations (a task: n examples); None: all
    split: str = "train"  # a dataset's or task's split
    column: str = "messages"  # a dataset's column of messages
    task_options: tuple[tuple[str, int | float | str], ...] = ()  # a task's settings, e.g. (("digits", 3),)

    def __post_init__(self) -> None:
        if self.task_options and not self.source.startswith("task:"):
            raise GptlabError(f"{self.source}: unknown option {self.task_options[0][0]!r}; options are n=N, split=NAME, column=NAME")
        if not self.source:
            raise GptlabError("a mixture part needs a source: a .jsonl file, hf:DATASET or task:NAME")
        if not (isinstance(self.epochs, (int, float)) and math.isfinite(self.epochs) and self.epochs > 0):
            raise GptlabError(f"{self.source}: epochs must be a number above 0, got {self.epochs!r}")
        if self.n is not None and self.n < 1:
            raise GptlabError(f"{self.source}: n must be at least 1, got {self.n}")

    @property
    def kind(self) -> str:
        """"task", "hf" or "files"."""
        if self.source.startswith("task:"):
            return "task"
        return "hf" if self.source.startswith("hf:") else "files"


@dataclass(frozen=True, kw_only=True)
class MixtureConfig:
    """Conversations for SFT: the parts, the shuffle seed, the held-out fraction and what to do with bad rows."""

    parts: tuple[PartConfig, ...]
    seed: int = 0  # shuffles each epoch and draws fractional epochs
    val_fraction: float = 0.0  # held out of every part for validation (see the module docstring)
    on_error: str = "skip"  # malformed conversations: "skip" (count and report) or "refuse" (raise)

    def __post_init__(self) -> None:
        if not self.parts:
            raise GptlabError("a mixture needs at least one source, e.g. chats.jsonl or task:arithmetic")
        if self.on_error not in ON_ERROR:
            raise GptlabError(f"on_error must be one of {', '.join(ON_ERROR)}, got {self.on_error!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise GptlabError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.seed < 0:
            raise GptlabError(f"seed must be 0 or more, got {self.seed}")

    @classmethod
    def from_spec(cls, spec: str, **fields) -> MixtureConfig:
        """The config for a spec string (`a.jsonl@2, task:arithmetic[n=500]`) and the other fields."""
        return cls(parts=parse_mixture(spec), **fields)


def parse_mixture(spec: str) -> tuple[PartConfig, ...]:
    """Parts from a spec string (module docstring): "a.jsonl@2, task:x[n=50]" ->
    (PartConfig(source="a.jsonl", epochs=2.0), PartConfig(source="task:x", n=50))."""
    parts = []
    for text in _split_outside_brackets(spec):
        match = _PART.match(text.strip())
        if not match:
            raise GptlabError(f"cannot read mixture part {text.strip()!r}: write SOURCE[n=N,split=S,column=C]@EPOCHS")
        fields: dict = {"source": match["source"].strip()}
        if match["epochs"] is not None:
            try:
                fields["epochs"] = float(match["epochs"])
            except ValueError:
                raise GptlabError(f"{text.strip()}: epochs after @ must be a number, got {match['epochs']!r}") from None
        fields.update(_parse_options(text.strip(), match["options"] or ""))
        parts.append(PartConfig(**fields))
    if not parts:
        raise GptlabError(f"empty mixture {spec!r}: name a .jsonl file, hf:DATASET or task:NAME")
    return tuple(parts)


def _split_outside_brackets(spec: str) -> list[str]:
    pieces, depth, current = [], 0, ""
    for char in spec:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            pieces.append(current)
            current = ""
        else:
            current += char
    pieces.append(current)
    return [piece for piece in pieces if piece.strip()]


def _parse_options(part: str, text: str) -> dict:
    """n, split and column; for a task, any other key=value is a setting of the task (digits=3, ops=+-)."""
    options, task_options = {}, []
    for item in filter(None, (piece.strip() for piece in text.split(","))):
        key, equals, value = (piece.strip() for piece in item.partition("="))
        if equals and value and key not in OPTIONS and part.strip().startswith("task:"):
            task_options.append((key, _option_value(value)))
            continue
        if not equals or key not in OPTIONS or not value:
            raise GptlabError(f"{part}: unknown option {item!r}; options are n=N, split=NAME, column=NAME")
        if key == "n":
            if not value.isdigit():
                raise GptlabError(f"{part}: n must be a whole number, got {value!r}")
            options["n"] = int(value)
        else:
            options[key] = value
    if task_options:
        options["task_options"] = tuple(task_options)
    return options


def _option_value(text: str) -> int | float | str:
    """"3" -> 3, "0.5" -> 0.5, anything else stays text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# ---------------------------------------------------------------- reading one source


@dataclass
class SourceReport:
    """What reading one source found: rows read, conversations kept, malformed ones skipped (the first few named)."""

    source: str
    read: int = 0
    kept: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)  # "chats.jsonl:7: message 1 has unknown role 'bot'; ..."
    train: int = 0
    val: int = 0
    unit: str = "conversations"  # what a kept row is (preference data: "pairs")

    def summary(self) -> str:
        """One line, and a line for each problem shown."""
        line = f"{self.source}: {self.kept:,} {self.unit} ({self.train:,} train, {self.val:,} val)"
        if self.skipped:
            line += f", {self.skipped:,} malformed skipped"
            line += "".join(f"\n  {problem}" for problem in self.problems)
            if self.skipped > len(self.problems):
                line += f"\n  ... and {self.skipped - len(self.problems):,} more"
        return line


class RowReader:
    """Collects the valid items of (where, record) rows under an on_error policy: conversations, or with another
    `parse` (record -> item, raising GptlabError saying what is wrong) any other kind of row, e.g. preference pairs."""

    def __init__(self, part: PartConfig, on_error: str, *, parse=None, unit: str = "conversations") -> None:
        self.part, self.on_error, self.unit = part, on_error, unit
        self.parse = parse or parse_conversation
        self.report = SourceReport(part.source, unit=unit)
        self.items: list = []

    @property
    def full(self) -> bool:
        return self.part.n is not None and len(self.items) >= self.part.n

    def add(self, where: str, record: object, problem: str | None = None) -> None:
        """Keep the parsed record if it is valid, else record the problem at `where`."""
        self.report.read += 1
        if problem is None:
            try:
                item = self.parse(record)
            except GptlabError as error:
                problem = str(error)
        if problem is not None:
            if self.on_error == "refuse":
                raise GptlabError(f"{where}: {problem} (on_error='skip' skips malformed {self.unit})")
            self.report.skipped += 1
            if len(self.report.problems) < SHOWN_PROBLEMS:
                self.report.problems.append(f"{where}: {problem}")
            return
        self.items.append(item)
        self.report.kept += 1


def parse_conversation(messages: object, tools: object = ()) -> Conversation:
    """The messages as a training Conversation offering `tools` (by default the tools `messages` carries, if it is
    a Conversation), or GptlabError naming the problem. Each message keeps only KEPT_FIELDS."""
    tools = tools or getattr(messages, "tools", ())
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence) or not all(isinstance(t, Mapping) for t in tools):
        raise GptlabError(f'"tools" must be a list of declarations like {{"type": "function", "function": {{...}}}}, got {tools!r:.60}')
    check_messages(messages)  # type: ignore[arg-type]
    kept = [{key: m[key] for key in KEPT_FIELDS if key in m} for m in messages]  # type: ignore[union-attr]
    return Conversation(kept, tools=tools)


def _parse_line(record: dict) -> Conversation:
    """A JSONL line's conversation: its messages and the tools it offers."""
    return parse_conversation(record["messages"], record.get("tools", ()))


def read_conversations(part: PartConfig, *, on_error: str = "skip") -> tuple[list[Conversation], SourceReport]:
    """The valid conversations of a file or dataset part, in source order, and the report of what was skipped."""
    if on_error not in ON_ERROR:
        raise GptlabError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    reader = RowReader(part, on_error, parse=_parse_line if part.kind == "files" else None)
    if part.kind == "task":
        raise GptlabError(f"{part.source} is a task: read it with read_task")
    if part.kind == "hf":
        _read_dataset(part, reader)
    else:
        if part.split != "train" or part.column != "messages":
            raise GptlabError(f"{part.source}: split and column are options of hf: datasets, not of .jsonl files")
        for path in jsonl_files(part.source):
            _read_jsonl(path, reader)
            if reader.full:
                break
    return reader.items, reader.report


def jsonl_files(spec: str) -> list[Path]:
    """A file, a glob or a folder (its .jsonl files, recursively), in a stable order; only .jsonl."""
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        if not files:
            raise GptlabError(f"folder {spec} holds no .jsonl files of conversations")
        return files
    files = find_files([spec])
    wrong = [str(file) for file in files if file.suffix != ".jsonl"]
    if wrong:
        raise GptlabError(f"{wrong[0]}: conversations are read from .jsonl files ({{\"messages\": [...]}} per line)")
    return files


def _read_jsonl(path: Path, reader: RowReader) -> None:
    for where, record, problem in jsonl_records(path):
        if reader.full:
            return
        if problem is None and (not isinstance(record, dict) or "messages" not in record):
            problem = 'no "messages" field (each line is {"messages": [{"role": ..., "content": ...}]})'
        reader.add(where, None if problem else record, problem)


def jsonl_records(path: Path) -> Iterator[tuple[str, object, str | None]]:
    """(where, record, problem) for each non-blank line: "chats.jsonl:7", the parsed JSON or None, and why not."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            if number == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]  # a UTF-8 byte-order mark from a Windows editor
            if number == 1 and line.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in line:
                yield where, None, "UTF-16 text (NUL bytes); save the file as UTF-8"
                continue
            try:
                yield where, json.loads(line.decode("utf-8")), None
            except UnicodeDecodeError:
                yield where, None, "not UTF-8 text; save the file as UTF-8"
            except json.JSONDecodeError as error:
                yield where, None, f"not valid JSON ({error.msg})"


def _read_dataset(part: PartConfig, reader: RowReader) -> None:
    source = HuggingFaceSource(part.source, SourceOptions(text_field=part.column, split=part.split))
    source.check()  # the column exists, when the dataset declares its columns
    for row, record in enumerate(source.records()):
        if reader.full:
            return
        if part.column not in record:
            raise GptlabError(f"{part.source} row {row}: no {part.column!r} column (it has: {', '.join(record)}; choose with [column=NAME])")
        reader.add(f"{part.source} row {row}", record[part.column])


def load_task(name: str, options: tuple[tuple[str, int | float | str], ...] = ()):
    """The built-in task called `name` with its settings (gptlab.chat.tasks.get_task)."""
    try:
        from gptlab.chat.tasks import get_task
    except ModuleNotFoundError as error:
        if error.name != "gptlab.chat.tasks":
            raise
        raise GptlabError(f"task:{name}: this gptlab has no built-in tasks (gptlab.chat.tasks)") from None
    return get_task(name, **dict(options))


def task_from_spec(spec: str, flag: str = "--task", sizes: str = "") -> object:
    """A built-in task from `NAME[options]` (or `task:NAME[options]`), e.g. arithmetic[digits=1]; `sizes` says which
    flags set how many examples (a spec's n= is refused)."""
    text = spec.strip()
    try:
        parts = parse_mixture(text if text.startswith("task:") else f"task:{text}")
    except GptlabError:
        raise GptlabError(f"{flag} {spec!r}: write NAME or NAME[option=value,...], e.g. arithmetic[digits=1]") from None
    if len(parts) != 1:
        raise GptlabError(f"{flag} {spec!r}: name one task, e.g. arithmetic[digits=1]")
    (part,) = parts
    if part.n is not None or part.epochs != 1.0 or part.split != "train":
        raise GptlabError(f"{flag} {spec}: give the task and its settings only, e.g. arithmetic[digits=1]"
                          + (f"; use {sizes} for sizes" if sizes else ""))
    return load_task(part.source.removeprefix("task:"), part.task_options)


def read_task(part: PartConfig, split: str, n: int | None, *, on_error: str = "skip") -> tuple[list[Conversation], SourceReport]:
    """n examples of a task's split as conversations, checked like any other source (n: see task_examples)."""
    task, examples = task_examples(part, split, n)
    reader = RowReader(replace(part, n=None), on_error)
    for number, example in enumerate(examples):
        reader.add(f"{part.source} {split} example {number}", task.conversation(example))
    return reader.items, reader.report


def task_examples(part: PartConfig, split: str, n: int | None) -> tuple:
    """The task of a task: part and n examples of its split. The test split is finite: n is capped at
    its size, and None means all of it; the train split needs n."""
    name = part.source[len("task:") :]
    if not name:
        raise GptlabError("task: needs a name, e.g. task:arithmetic")
    if part.column != "messages":
        raise GptlabError(f"{part.source}: column is an option of hf: datasets, not of tasks")
    task = load_task(name, part.task_options)
    size = getattr(task, "test_size", None) if split == "test" else None
    if n is None and size is None:
        raise GptlabError(f"{part.source}: say how many {split} examples to make, e.g. {part.source}[n=5000]")
    if size is not None:
        n = size if n is None else min(n, size)
    return task, task.examples(split, n)


# ---------------------------------------------------------------- the mixture


@dataclass
class Part:
    """Conversations that enter a mixture `epochs` times per epoch."""

    name: str
    conversations: list[Conversation]
    epochs: float = 1.0

    @property
    def count(self) -> int:
        """Conversations this part puts in one mixture epoch."""
        return round(self.epochs * len(self.conversations))


class Mixture:
    """The conversations of several parts in a seeded order: epoch e is a shuffle drawn from (seed, e).

    `order(epoch)` lists (part, index) pairs; `get(part, index)` is the conversation. Only the
    order depends on the epoch, so a reader resumes from (epoch, position) alone.
    """

    def __init__(self, parts: Sequence[Part], *, seed: int = 0, reports: Sequence[SourceReport] = ()) -> None:
        self.parts = list(parts)
        self.seed = seed
        self.reports = list(reports)
        if len(self) == 0:
            raise GptlabError(_why_empty(self.parts, self.reports))
        self._orders: dict[int, np.ndarray] = {}

    @classmethod
    def of(cls, conversations: Sequence[Conversation], *, epochs: float = 1.0, seed: int = 0) -> Mixture:
        """A one-part mixture of conversations already in memory."""
        return cls([Part("conversations", list(conversations), epochs)], seed=seed)

    @classmethod
    def load(cls, config: MixtureConfig, split: str = "train") -> Mixture:
        """The mixture's `train` or held-out `val` conversations (val: each once, from val_fraction)."""
        if split not in ("train", "val"):
            raise GptlabError(f"a mixture split is 'train' or 'val', got {split!r}")
        if split == "val" and config.val_fraction == 0:
            raise GptlabError("no held-out conversations: set val_fraction (e.g. 0.01) to carve a val split")
        parts, reports = [], []
        for part in config.parts:
            train, val, report = _read_split(part, config)
            conversations = train if split == "train" else val
            parts.append(Part(part.source, conversations, part.epochs if split == "train" else 1.0))
            reports.append(report)
        return cls(parts, seed=config.seed, reports=reports)

    def __len__(self) -> int:
        """Conversations in one mixture epoch."""
        return sum(part.count for part in self.parts)

    def get(self, part: int, index: int) -> Conversation:
        return self.parts[part].conversations[index]

    def order(self, epoch: int) -> np.ndarray:
        """(len(self), 2) int64 rows of (part, index): every part's whole passes plus a seeded subset for the
        fraction, shuffled together. Part p's subset comes from (seed, epoch, p), so adding a part keeps the others'."""
        if epoch not in self._orders:
            if len(self._orders) > 4:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = self._draw_order(epoch)
        return self._orders[epoch]

    def _draw_order(self, epoch: int) -> np.ndarray:
        pieces = []
        for number, part in enumerate(self.parts):
            size = len(part.conversations)
            whole = int(part.count // size) if size else 0
            indices = [np.tile(np.arange(size, dtype=np.int64), whole)]
            rest = part.count - whole * size
            if rest:
                generator = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, number]))
                indices.append(np.sort(generator.choice(size, rest, replace=False)))
            indices = np.concatenate(indices)
            pieces.append(np.stack([np.full_like(indices, number), indices], axis=1))
        order = np.concatenate(pieces)
        shuffle = np.random.default_rng(np.random.SeedSequence([self.seed, epoch])).permutation(len(order))
        return order[shuffle]

    def summary(self) -> str:
        """A line per source for the CLI: conversations kept, held out and skipped."""
        return "\n".join(report.summary() for report in self.reports)


def _why_empty(parts: Sequence[Part], reports: Sequence[SourceReport]) -> str:
    """One line for a mixture with nothing to train on: the first reasons, by file:line, and how many more.

    "the mixture holds no pairs: no valid row in a.jsonl (3 read): a.jsonl:1: chosen and rejected are the same
    reply; a.jsonl:2: no "rejected" field ...; and 1 more; fix the rows or name other sources"
    """
    unit = reports[0].unit if reports else "conversations"
    names = ", ".join(part.name for part in parts) or "no sources"
    head = f"the mixture holds no {unit}"
    if not reports or any(report.kept for report in reports):  # rows were kept: too few for the split or the epochs
        return f"{head} ({names}); check the sources, their n= and @epochs, and val_fraction"
    reasons = [f"{report.source}: no rows (an empty file?)" for report in reports if not report.read]
    reasons += [problem for report in reports for problem in report.problems]
    hidden = sum(report.skipped - len(report.problems) for report in reports)
    shown = reasons[:SHOWN_REASONS]
    more = len(reasons) - len(shown) + hidden
    read = sum(report.read for report in reports)
    return (f"{head}: no valid row in {names} ({read:,} read): " + "; ".join(shown)
            + (f"; and {more:,} more" if more else "") + "; fix the rows (each is named by file:line) or name other sources")


def _read_split(part: PartConfig, config: MixtureConfig) -> tuple[list[Conversation], list[Conversation], SourceReport]:
    """A part's train and held-out conversations and its report."""
    if part.kind == "task":
        train, report = read_task(part, part.split, part.n, on_error=config.on_error)
        val: list[Conversation] = []
        if config.val_fraction > 0:
            n_val = math.ceil(config.val_fraction * part.n) if part.n is not None else None
            val, val_report = read_task(part, "test", n_val, on_error=config.on_error)
            _merge_reports(report, val_report)
        report.train, report.val = len(train), len(val)
        return train, val, report
    conversations, report = read_conversations(part, on_error=config.on_error)
    held = held_out(part.source, conversations, config.val_fraction)
    train = [c for i, c in enumerate(conversations) if i not in held]
    val = [conversations[i] for i in sorted(held)]
    report.train, report.val = len(train), len(val)
    return train, val, report


def held_out(source: str, rows: Sequence, fraction: float) -> set[int]:
    """The indices of the ceil(fraction × len(rows)) rows whose content hashes lowest (ties by position).

    Drawn from the rows themselves, not from how the source was named: `world/sft.jsonl`, `./world/sft.jsonl` and
    the file moved elsewhere hold out the same rows, whatever the training seed; a row added to the file leaves the
    others where they were, and identical rows fall on the same side (a duplicate cannot leak into validation)."""
    count = math.ceil(fraction * len(rows))
    if count == 0:
        return set()
    if count >= len(rows):
        raise GptlabError(f"{source}: holding out {fraction} of {len(rows)} conversations leaves none to train on; lower val_fraction")
    digests = [hashlib.sha256(json.dumps(row, sort_keys=True, default=_plain).encode("utf-8")).digest() for row in rows]
    return set(sorted(range(len(rows)), key=lambda i: (digests[i], i))[:count])


def _plain(value: object) -> object:
    """A dataclass row (a preference pair, a prompt) as the dict json.dumps can write."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"cannot hash a {type(value).__name__} row")


def _merge_reports(into: SourceReport, other: SourceReport) -> None:
    into.read += other.read
    into.kept += other.kept
    into.skipped += other.skipped
    into.problems = (into.problems + other.problems)[:SHOWN_PROBLEMS]


def iter_conversations(mixture: Mixture, epoch: int = 0) -> Iterator[Conversation]:
    """One epoch of the mixture in its order."""
    for part, index in mixture.order(epoch):
        yield mixture.get(int(part), int(index))
