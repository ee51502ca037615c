"""Preference pairs for DPO: read, checked, split for validation, rendered and batched with resumable state.

A pair is a prompt (messages ending with the user's) and two assistant replies, the chosen and
the rejected. Sources are named in a mixture spec as for SFT (gptlab.chat.data: parts,
`[n=...,split=...]` options, `@EPOCHS`):

    prefs.jsonl        one pair per line, in any of the Hugging Face / TRL preference formats:
                       {"prompt": "2+2?", "chosen": "4", "rejected": "5"}                     standard
                       {"prompt": [messages], "chosen": [{"role": "assistant", ...}], "rejected": [...]}
                       {"messages": [messages], "chosen": ..., "rejected": ...}               messages for prompt
                       {"chosen": [whole conversation], "rejected": [whole conversation]}    implicit prompt:
                                                                  the messages both share are the prompt
                                                                  (also when a prompt is given, as in UltraFeedback)
                       an optional "margin" number (TRL's reward-model column) rides along; DPO ignores it
    hf:NAME, hf:/dir   a dataset with those columns (options n, split)
    task:arithmetic[n=2000,digits=1]
                       built-in task examples: chosen is the task's reply, rejected the same reply made
                       wrong (its last number moved by 1 to 3, or, without a number, two items or letters
                       swapped or one dropped), redrawn until the task's verifier rejects it. The corruption
                       is seeded by the question, so a pair is the same in every run.

Held out (val_fraction): ceil(f × pairs) of every file and dataset, a task's `test` split.
Malformed rows are named by file:line or dataset row and skipped (counted, reported) or refused.

Rendering (ChatFormat): prompt + reply, targets only on the final reply and its <|end|>. A pair whose
chosen or rejected rendering is longer than seq_len + 1 tokens is dropped and counted.
Batches are (x, y, {"pair_index": (B,)}) with x, y (2B, T): rows 0..B-1 the chosen replies and B..2B-1
the rejected ones of the same pairs, right-padded (y = -100) to the longest row of the batch.
pair_index numbers a split's pairs in source order, which is what reference log-probs are stored by.

Not here: the loss and the loop (gptlab.align.preference.dpo), the chat format (gptlab.chat.format).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch

from gptlab.chat import ChatFormat
from gptlab.chat.data import (
    Mixture,
    MixtureConfig,
    Part,
    PartConfig,
    RowReader,
    SourceReport,
    held_out,
    jsonl_files,
    jsonl_records,
    task_examples,
)
from gptlab.chat.format import check_messages
from gptlab.data.sources import HuggingFaceSource, SourceOptions
from gptlab.runtime import GptlabError

IGNORE = -100  # the model's ignore_index
INTEGER = r"(?<!\d)-?\d+"  # as gptlab.chat.tasks.base: a minus right after a digit is subtraction
CORRUPTION_TRIES = 20  # corrupted replies drawn per task example before giving up on it


@dataclass(frozen=True)
class Pair:
    prompt: list  # messages, the last the user's
    chosen: str  # the preferred assistant reply
    rejected: str  # the dispreferred one
    margin: float = 0.0  # a record's "margin" (TRL's reward-model column): how far chosen should out-score rejected


# ---------------------------------------------------------------- parsing one row


def parse_pair(record: object) -> Pair:
    """A pair from a record in any of the formats of the module docstring; GptlabError says what is wrong."""
    if not isinstance(record, Mapping):
        raise GptlabError('not an object with "chosen" and "rejected"')
    missing = [key for key in ("chosen", "rejected") if key not in record]
    if missing:
        raise GptlabError(f'no "{missing[0]}" field (a pair is {{"prompt": ..., "chosen": ..., "rejected": ...}})')
    prompt = record.get("prompt", record.get("messages"))
    chosen, rejected = record["chosen"], record["rejected"]
    if _whole_conversations(chosen, rejected):  # UltraFeedback's rows carry a prompt too: the conversations say more
        prompt = None
    if prompt is None:
        if not (isinstance(chosen, list) and isinstance(rejected, list)):
            raise GptlabError("without a prompt, chosen and rejected must be whole conversations (lists of messages)")
        shared = 0
        while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
            shared += 1
        if shared == len(chosen) or shared == len(rejected):
            raise GptlabError("chosen and rejected do not differ in a final reply")
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise GptlabError("the prompt must be text or a non-empty list of messages")
    check_messages(prompt, for_generation=True)
    pair = Pair([{"role": m["role"], "content": m["content"]} for m in prompt],
                _reply(chosen, "chosen"), _reply(rejected, "rejected"), _margin(record.get("margin", 0.0)))
    if pair.chosen == pair.rejected:
        raise GptlabError("chosen and rejected are the same reply")
    return pair


def _whole_conversations(chosen: object, rejected: object) -> bool:
    """Both replies are conversations that open with a turn of the user's or system's, not bare assistant replies."""
    return all(isinstance(value, list) and value and isinstance(value[0], Mapping) and value[0].get("role") != "assistant"
               for value in (chosen, rejected))


def _margin(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GptlabError(f"margin must be a finite number, got {value!r}")
    return float(value)


def _reply(value: object, name: str) -> str:
    """"text" or [{"role": "assistant", "content": "text"}] -> "text"."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], Mapping) \
            and value[0].get("role") == "assistant":
        value = value[0].get("content")
    if not isinstance(value, str):
        raise GptlabError(f'{name} must be one assistant reply: text or [{{"role": "assistant", "content": "..."}}]')
    if not value.strip():
        raise GptlabError(f"{name} is empty")
    return value


# ---------------------------------------------------------------- task pairs


def wrong_reply(task, example) -> str | None:
    """The example's reply corrupted until task.verify rejects it (seeded by the question), or None."""
    rng = random.Random(f"gptlab/dpo/{task.name}/{example.question}")
    for _ in range(CORRUPTION_TRIES):
        candidate = corrupt(example.reply, rng)
        if candidate.strip() and candidate != example.reply and not task.verify(example, candidate):
            return candidate
    return None


def corrupt(reply: str, rng: random.Random) -> str:
    """"3 + 4 = 7" -> "3 + 4 = 9"; "apple, crown, pear" -> "crown, apple, pear"; "c-r-o-w-n" -> "c-r-w-o-n"."""
    numbers = list(re.finditer(INTEGER, reply))
    if numbers:
        last = numbers[-1]
        value = int(last.group())
        offset = rng.choice([d for d in (-3, -2, -1, 1, 2, 3) if value + d >= 0])
        return reply[: last.start()] + str(value + offset) + reply[last.end() :]
    for separator in (", ", "-", ""):
        items = reply.split(separator) if separator else list(reply)
        if len(items) > 1:
            break
    if len(items) < 2:
        return reply + reply
    if separator != ", " and rng.random() < 0.5:
        del items[rng.randrange(len(items))]  # a letter dropped
    else:
        i = rng.randrange(len(items) - 1)
        j = rng.randrange(i + 1, len(items))
        items[i], items[j] = items[j], items[i]
    return separator.join(items)


# ---------------------------------------------------------------- reading sources


def read_pairs(part: PartConfig, split: str = "train", n: int | None = None, *,
               on_error: str = "skip") -> tuple[list[Pair], SourceReport]:
    """The valid pairs of a part in source order and the report of what was skipped.
    A task part makes n examples of its `split` (files and datasets: split and n come from the part)."""
    if part.kind == "task":
        task, examples = task_examples(part, split, n)
        reader = RowReader(replace(part, n=None), on_error, parse=parse_pair, unit="pairs")
        for number, example in enumerate(examples):
            where = f"{part.source} {split} example {number}"
            rejected = wrong_reply(task, example)
            record = {"prompt": task.conversation(example)[:-1], "chosen": example.reply, "rejected": rejected}
            reader.add(where, record, None if rejected else "no corruption of the reply that the verifier rejects")
        return reader.items, reader.report
    if part.column != "messages":
        raise GptlabError(f"{part.source}: preference pairs have no column option; their columns are prompt, chosen, rejected")
    if part.kind != "hf" and part.split != "train":
        raise GptlabError(f"{part.source}: split is an option of hf: datasets and tasks, not of .jsonl files")
    return read_rows(part, RowReader(part, on_error, parse=parse_pair, unit="pairs"), "chosen", check=True)


def read_rows(part: PartConfig, reader: RowReader, text_field: str, *, check: bool = False) -> tuple[list, SourceReport]:
    """A .jsonl or hf: part's rows through `reader` (parsed, checked, counted: malformed ones named by file:line or
    dataset row) until it holds what the part asks for. `check`: the dataset's columns are checked first."""
    if part.kind == "hf":
        source = HuggingFaceSource(part.source, SourceOptions(text_field=text_field, split=part.split))
        if check:
            source.check()
        rows = ((f"{part.source} row {row}", record, None) for row, record in enumerate(source.records()))
    else:
        rows = (row for path in jsonl_files(part.source) for row in jsonl_records(path))
    for where, record, problem in rows:
        if reader.full:
            break
        reader.add(where, record, problem)
    return reader.items, reader.report


@dataclass
class PairSplit:
    """A split's pairs as a Mixture (parts, epochs, seeded order) and their numbering for reference log-probs."""

    mixture: Mixture
    offsets: list[int]  # the index of part p's first pair

    @property
    def pairs(self) -> list[Pair]:
        """Every pair once, in index order."""
        return [pair for part in self.mixture.parts for pair in part.conversations]

    def index(self, part: int, position: int) -> int:
        return self.offsets[part] + position


def load_pairs(config: MixtureConfig) -> dict[str, PairSplit]:
    """{"train": ..., "val": ...} (val when config.val_fraction > 0), each part's report in train's mixture."""
    train_parts, val_parts, reports = [], [], []
    for part in config.parts:
        if part.kind == "task":
            train, report = read_pairs(part, part.split, part.n, on_error=config.on_error)
            val = []
            if config.val_fraction > 0:
                n_val = math.ceil(config.val_fraction * part.n) if part.n is not None else None
                val, val_report = read_pairs(part, "test", n_val, on_error=config.on_error)
                report.read, report.kept, report.skipped = (report.read + val_report.read, report.kept + val_report.kept,
                                                            report.skipped + val_report.skipped)
        else:
            pairs, report = read_pairs(part, on_error=config.on_error)
            held = held_out(part.source, pairs, config.val_fraction)
            train = [pair for i, pair in enumerate(pairs) if i not in held]
            val = [pairs[i] for i in sorted(held)]
        report.train, report.val = len(train), len(val)
        train_parts.append(Part(part.source, train, part.epochs))
        val_parts.append(Part(part.source, val, 1.0))
        reports.append(report)
    splits = {"train": _split(train_parts, config.seed, reports)}
    if config.val_fraction > 0:
        splits["val"] = _split(val_parts, config.seed, reports)
    return splits


def _split(parts: list[Part], seed: int, reports: list[SourceReport]) -> PairSplit:
    offsets = np.cumsum([0] + [len(part.conversations) for part in parts])[:-1].tolist()
    return PairSplit(Mixture(parts, seed=seed, reports=reports), offsets)


# ---------------------------------------------------------------- rendering and batching


@dataclass(frozen=True)
class RenderedPair:
    chosen: list[int]  # prompt + chosen reply + <|end|>
    rejected: list[int]
    start: int  # tokens of the prompt (through <|assistant|>): targets are the tokens from here on


def render_pair(chat: ChatFormat, pair: Pair, seq_len: int) -> RenderedPair | None:
    """The pair's two renderings, or None when either is longer than seq_len + 1 tokens."""
    start = len(chat.prompt(pair.prompt))
    chosen = chat.render([*pair.prompt, {"role": "assistant", "content": pair.chosen}]).ids
    rejected = chat.render([*pair.prompt, {"role": "assistant", "content": pair.rejected}]).ids
    if max(len(chosen), len(rejected)) > seq_len + 1:
        return None
    return RenderedPair(chosen, rejected, start)


def render_pairs(chat: ChatFormat, split: PairSplit, seq_len: int) -> list[RenderedPair | None]:
    """Every pair of the split rendered, by index (None: too long, dropped)."""
    return [render_pair(chat, pair, seq_len) for pair in split.pairs]


def pair_rows(rendered: list[RenderedPair], bos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y (2B, T) int64: the chosen rows, then the rejected ones; T the longest row, the rest padded."""
    sequences = [item.chosen for item in rendered] + [item.rejected for item in rendered]
    starts = [item.start for item in rendered] * 2
    T = max(len(ids) for ids in sequences) - 1
    x = np.full((len(sequences), T), bos, dtype=np.int64)
    y = np.full((len(sequences), T), IGNORE, dtype=np.int64)
    for row, (ids, start) in enumerate(zip(sequences, starts)):
        x[row, : len(ids) - 1] = ids[:-1]
        y[row, start - 1 : len(ids) - 1] = ids[start:]  # token t predicts t + 1: the reply's tokens and its <|end|>
    return torch.from_numpy(x), torch.from_numpy(y)


@dataclass(frozen=True, kw_only=True)
class PairLoaderConfig:
    batch_size: int  # B: pairs per batch on each rank (2B rows)
    seq_len: int  # a rendering takes at most seq_len + 1 tokens
    cycle: bool = True  # False: one epoch, then StopIteration (validation)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.seq_len < 1:
            raise GptlabError(f"batch_size and seq_len must be at least 1, got {self.batch_size} and {self.seq_len}")


class PairLoader:
    """Batches of pairs from a PairSplit for one rank: position i of an epoch's order belongs to rank i mod world_size.

    The order is the split's Mixture's (seeded by (seed, epoch)); pairs too long for seq_len are skipped and
    counted in `stats`. The state (epoch, position, stats) is plain JSON, so a fresh loader given it serves
    exactly the batches the saved one would have.
    """

    def __init__(self, split: PairSplit, rendered: list[RenderedPair | None], chat: ChatFormat, *,
                 config: PairLoaderConfig, rank: int = 0, world_size: int = 1, device: str | torch.device = "cpu") -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise GptlabError(f"rank must be in [0, world_size), got rank={rank} world_size={world_size}")
        if sum(item is not None for item in rendered) < world_size:
            raise GptlabError(f"{sum(item is not None for item in rendered)} pairs fit seq_len {config.seq_len}, "
                              f"fewer than the {world_size} ranks; raise seq_len or add data")
        self.split, self.rendered, self.chat, self.config = split, rendered, chat, config
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self.reset()

    def reset(self) -> None:
        self._epoch, self._position = 0, self.rank
        self.stats = {"pairs": 0, "dropped": 0}

    def _pull(self) -> int | None:
        """The index of this rank's next pair that fits (counting drops), or None at the end of a non-cycling epoch."""
        mixture = self.split.mixture
        while True:
            if self._position >= len(mixture):
                if not self.config.cycle:
                    return None
                self._epoch, self._position = self._epoch + 1, self.rank
            part, position = mixture.order(self._epoch)[self._position]
            self._position += self.world_size
            index = self.split.index(int(part), int(position))
            if self.rendered[index] is not None:
                return index
            self.stats["dropped"] += 1

    def _next_indices(self) -> list[int]:
        """The next batch's pair numbers (fewer at an epoch's end); StopIteration when a non-cycling epoch is done."""
        indices = []
        while len(indices) < self.config.batch_size and (index := self._pull()) is not None:
            indices.append(index)
        if not indices:
            raise StopIteration
        self.stats["pairs"] += len(indices)
        return indices

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """x, y (2B, T) and {"pair_index": (B,) int64}; StopIteration after a non-cycling epoch."""
        indices = self._next_indices()
        x, y = pair_rows([self.rendered[i] for i in indices], self.chat.bos)
        index = torch.tensor(indices, dtype=torch.int64)
        return x.to(self.device), y.to(self.device), {"pair_index": index.to(self.device)}

    def __iter__(self):
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    def state_dict(self) -> dict:
        """Where the stream stands, as plain JSON (goes into trainer_state.json)."""
        return {"kind": "pairs", "batch_size": self.config.batch_size, "seq_len": self.config.seq_len,
                "seed": self.split.mixture.seed, "epoch_size": len(self.split.mixture), "rank": self.rank,
                "world_size": self.world_size, "epoch": self._epoch, "position": self._position, "stats": dict(self.stats)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`: the next batches are those the saved loader would have served next."""
        if not isinstance(state, dict) or state.get("kind") != "pairs":
            raise GptlabError("loader state was not made by PairLoader.state_dict; resume with the same loader kind")
        ours = self.state_dict()
        fixed = ("batch_size", "seq_len", "seed", "epoch_size", "rank", "world_size")
        different = [f"{key} {state.get(key)!r} (this loader: {ours[key]!r})" for key in fixed if state.get(key) != ours[key]]
        if different:
            raise GptlabError(f"loader state was saved by a different loader: {', '.join(different)}; "
                              "resume with the same pairs, config, rank and world size")
        self._epoch, self._position = int(state["epoch"]), int(state["position"])
        self.stats = {key: int(value) for key, value in state["stats"].items()}
