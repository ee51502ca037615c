"""Training SentencePiece-style BPE (Llama 2 style): code points, "▁" for spaces, byte fallback, character coverage.

What the `sentencepiece` library's BPE trainer does (trainer_interface.cc, bpe_model_trainer.cc), written
again in Python:

1. Sentences. Each line of each document is a sentence; it is normalised as the model will normalise
   it at encoding time (gptlab.tokenizer.sp_normalize: charsmap, whitespace rules, dummy prefix, spaces
   as "▁"). Control and user-defined symbols in the text are boundaries, never learned from.
2. Character coverage. Characters are sorted by count (ties: lower code point first) and kept until
   `character_coverage` of all characters are covered; the rest are rare, never part of a piece, and
   encode as bytes (byte fallback) or <unk>.
3. Words. A sentence splits before every "▁" ("▁the▁cat" -> "▁the", "▁cat") and at rare characters;
   distinct words are counted.
4. Merges. Every adjacent pair of symbols whose concatenation is a valid piece (at most
   `max_piece_length` characters, "▁" only at the start, no digit in a longer piece with `split_digits`,
   one Unicode script with `split_by_unicode_script`; hiragana and katakana count as Han, combining marks
   take the script before them) is counted, weighted by word counts. The most frequent pair becomes a
   piece (ties: the shorter piece, then the smaller string, as the library breaks them), the words holding
   it are rewritten, and only their pairs are re-counted; a heap finds the best pair.
   `learn_pieces` is the readable version; `learn_pieces_fast` runs the same steps in C (_sptrain.c,
   proven equal piece for piece by tests/tokenizer/test_sp_train_native.py), given each character's
   traits (PieceRules.traits) so that C judges pairs without Unicode tables.
5. The vocabulary, in id order: <unk>, the control symbols (<s>, </s>), the user-defined symbols, the
   256 byte pieces <0x00>..<0xFF> (byte fallback), the merged pieces scored 0, -1, -2, ... in merge order,
   then the single characters in coverage order, scored on from there. Encoding merges by highest score,
   so the score order is the merge order.

Pair counts can tie differently from the library's (it counts from a hash table), so the pieces are not
always the library's; the `.model` file is an ordinary BPE model that the library and gptlab encode alike.

Not here: encoding (gptlab.tokenizer.sentencepiece), the file format (gptlab.tokenizer.sp_model).
"""

from __future__ import annotations

import functools
import heapq
import os
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import regex
from tqdm.auto import tqdm

from gptlab.runtime import GptlabError
from gptlab.tokenizer import native
from gptlab.tokenizer.sp_model import BPE, BYTE, CONTROL, NORMAL, SPACE, UNKNOWN, USER_DEFINED, NormalizerSpec, Piece, SentencePieceModel
from gptlab.tokenizer.train import merge_pair, read_text_chunks

UNK_PIECE = "<unk>"
BLOCKED, HAS_SPACE = 1, 2  # PieceRules.traits flags: in no longer piece; "▁", only at a piece's start
NORMALIZERS = ("identity", "nfkc", "nmt_nfkc", "nfkc_cf", "nmt_nfkc_cf")  # the library's built-in rule sets


@dataclass(frozen=True, kw_only=True)
class SentencePieceTrainerConfig:
    """The options of SentencePiece BPE training; defaults give a Llama 2 style model."""

    vocab_size: int  # total ids: <unk>, control and user-defined symbols, byte pieces, merged pieces, characters
    byte_fallback: bool = True  # add <0x00>..<0xFF> so characters no piece covers encode as bytes, not <unk>
    character_coverage: float = 0.9995  # the share of the corpus's characters that must be pieces; the rarest rest fall back
    control_symbols: tuple[str, ...] = ("<s>", "</s>")  # ids 1, 2, ...: never produced by encoding text (BOS, EOS)
    user_defined_symbols: tuple[str, ...] = ()  # always one piece wherever they appear in text
    normalizer: str = "identity"  # the library's rule set: identity (Llama 2), nfkc, nmt_nfkc, nfkc_cf, nmt_nfkc_cf
    add_dummy_prefix: bool = True  # a "▁" before the text, so a first word encodes like any other
    remove_extra_whitespaces: bool = False  # strip and collapse runs of spaces (Llama 2: False)
    split_digits: bool = True  # every digit its own piece (Llama 2)
    split_by_unicode_script: bool = True  # no piece mixes scripts (letters, digits and punctuation stay apart)
    max_piece_length: int = 16  # the longest piece, in characters

    def __post_init__(self) -> None:
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise GptlabError(f"vocab_size must be a positive number of ids, got {self.vocab_size!r}")
        if not 0 < self.character_coverage <= 1:
            raise GptlabError(f"character_coverage must be in (0, 1], got {self.character_coverage}; e.g. 0.9995, or 1 to keep every character")
        if self.normalizer not in NORMALIZERS:
            raise GptlabError(f"unknown normalizer {self.normalizer!r}; choose one of {', '.join(NORMALIZERS)}")
        if not 1 <= self.max_piece_length <= 512:
            raise GptlabError(f"max_piece_length must be 1 to 512 characters, got {self.max_piece_length}")
        symbols = [UNK_PIECE, *self.control_symbols, *self.user_defined_symbols]
        for symbol in symbols[1:]:
            if not isinstance(symbol, str) or not symbol:
                raise GptlabError(f"control and user-defined symbols must be non-empty strings, got {symbol!r}")
        repeated = next((symbol for symbol in symbols if symbols.count(symbol) > 1), None)
        if repeated is not None:
            raise GptlabError(f"symbol {repeated!r} is given twice (control, user-defined and {UNK_PIECE} must all differ)")
        if self.vocab_size < self.minimum_vocab_size:
            raise GptlabError(self._too_small(self.minimum_vocab_size))

    @property
    def meta_pieces(self) -> list[Piece]:
        """The pieces before the learned ones, in id order."""
        pieces = [Piece(UNK_PIECE, 0.0, UNKNOWN)]
        pieces += [Piece(symbol, 0.0, CONTROL) for symbol in self.control_symbols]
        pieces += [Piece(symbol, 0.0, USER_DEFINED) for symbol in self.user_defined_symbols]
        if self.byte_fallback:
            pieces += [Piece(f"<0x{byte:02X}>", 0.0, BYTE) for byte in range(256)]
        return pieces

    @property
    def minimum_vocab_size(self) -> int:
        """The meta pieces plus one character: the least any corpus needs."""
        return len(self.meta_pieces) + 1

    def _too_small(self, minimum: int, characters: int | None = None) -> str:
        needs = f"{len(self.meta_pieces)} meta pieces (<unk>, control, user-defined" + (", 256 bytes)" if self.byte_fallback else ")")
        needs += f" + {characters} required characters" if characters is not None else " + at least one character"
        return f"vocab_size {self.vocab_size} is too small: this model needs at least {minimum} ids ({needs}); raise the vocab size or lower character_coverage"


def train_sentencepiece(
    texts: Iterable[str] | None = None,
    *,
    files: Sequence[str | os.PathLike] = (),
    progress: bool = False,
    **options,
) -> SentencePieceModel:
    """Train a SentencePiece BPE model on documents (`texts`, and/or text `files`); options as SentencePieceTrainerConfig."""
    config = SentencePieceTrainerConfig(**options)
    return train_with_config(config, texts=texts, files=files, progress=progress)


def train_with_config(
    config: SentencePieceTrainerConfig,
    *,
    texts: Iterable[str] | None = None,
    files: Sequence[str | os.PathLike] = (),
    progress: bool = False,
) -> SentencePieceModel:
    """`train_sentencepiece` with a built config."""
    for path in files:
        if not Path(path).is_file():
            raise GptlabError(f"input file not found: {path}")
    spec = normalizer_spec(config)
    sentences = Counter(_lines(texts, files))
    segments = _segments(sentences, spec, config)
    characters = required_characters(segments, config.character_coverage)
    if not characters:
        raise GptlabError("nothing to train on: the input holds no text (after normalising)")
    minimum = len(config.meta_pieces) + len(characters)
    if config.vocab_size < minimum:
        raise GptlabError(config._too_small(minimum, len(characters)))
    words = count_words(segments, set(characters))
    valid = PieceRules(config.max_piece_length, config.split_digits, config.split_by_unicode_script)
    merged = learn_pieces_fast(words, config.vocab_size - minimum, valid, progress=progress)
    pieces = config.meta_pieces
    pieces += [Piece(text, -float(i), NORMAL) for i, text in enumerate(merged)]
    pieces += [Piece(char, -float(len(merged) + i), NORMAL) for i, char in enumerate(characters)]
    return SentencePieceModel(
        pieces=tuple(pieces),
        normalizer=spec,
        byte_fallback=config.byte_fallback,
        trainer={"vocab_size": len(pieces), "character_coverage": config.character_coverage},
        raw=_trainer_proto(config, len(pieces)),
    )


# ---------------------------------------------------------------- 1-3. sentences, characters, words


def normalizer_spec(config: SentencePieceTrainerConfig) -> NormalizerSpec:
    """The NormalizerSpec the model declares; the charsmap of a non-identity rule set is the library's own."""
    charsmap = b""
    if config.normalizer != "identity":
        import sentencepiece
        from sentencepiece import sentencepiece_model_pb2

        built = sentencepiece_model_pb2.NormalizerSpec()
        built.ParseFromString(sentencepiece.SentencePieceNormalizer(rule_name=config.normalizer).serialized_normalizer_spec())
        charsmap = bytes(built.precompiled_charsmap)
    return NormalizerSpec(
        name=config.normalizer,
        charsmap=charsmap,
        add_dummy_prefix=config.add_dummy_prefix,
        remove_extra_whitespaces=config.remove_extra_whitespaces,
        escape_whitespaces=True,
    )


def _lines(texts: Iterable[str] | None, files: Sequence[str | os.PathLike]) -> Iterator[str]:
    """Every line of every document (files are streamed); a line is a sentence, as in the library."""
    for path in files:
        rest = ""
        for chunk in read_text_chunks(Path(path)):
            *lines, rest = (rest + chunk).split("\n")
            yield from lines
        yield rest
    for text in texts or ():
        yield from text.split("\n")


def _segments(sentences: Counter, spec: NormalizerSpec, config: SentencePieceTrainerConfig) -> Counter:
    """Normalised sentences cut at control and user-defined symbols (which are never learned from), with counts."""
    from gptlab.tokenizer.sp_normalize import SentencePieceNormalizer

    normalize_many = SentencePieceNormalizer(spec, user_defined=config.user_defined_symbols).normalize_many
    symbols = [*config.control_symbols, *config.user_defined_symbols, UNK_PIECE]
    boundary = regex.compile("|".join(regex.escape(symbol) for symbol in sorted(symbols, key=len, reverse=True)))
    normalized = list(zip(normalize_many(list(sentences)), sentences.values()))
    if not any("\n" in symbol for symbol in symbols) and not boundary.search("\n".join(text for text, _ in normalized)):
        boundary = None  # no symbol in the corpus (the usual case): one search instead of one split per sentence
    segments: Counter = Counter()
    for text, count in normalized:
        for segment in boundary.split(text) if boundary is not None else (text,):
            if segment:
                segments[segment] += count
    return segments


def required_characters(segments: dict[str, int], coverage: float) -> list[str]:
    """The characters to keep, most frequent first (ties: lower code point), until `coverage` of all are covered."""
    totals = np.zeros(0, np.int64)  # code point -> count
    for count, group in _by_count(segments).items():
        points = np.frombuffer("".join(group).encode("utf-32-le", "surrogatepass"), np.uint32)
        found = np.bincount(points).astype(np.int64) * count  # one pass per distinct count, not per segment
        if len(found) > len(totals):
            totals = np.pad(totals, (0, len(found) - len(totals)))
        totals[: len(found)] += found
    totals[[code for code in (ord("\t"), 0) if code < len(totals)]] = 0  # the library's boundary marks are never pieces
    codes = np.flatnonzero(totals)
    codes = codes[np.lexsort((codes, -totals[codes]))]
    total = int(totals.sum())
    kept, covered = [], 0
    for code in codes.tolist():
        if coverage < 1 and covered / total >= coverage:
            break
        kept.append(chr(code))
        covered += int(totals[code])
    return kept


def _by_count(segments: dict[str, int]) -> dict[int, list[str]]:
    """Segments grouped by their count: most counts are 1, so a few joined strings stand for them all."""
    groups: dict[int, list[str]] = defaultdict(list)
    for segment, count in segments.items():
        groups[count].append(segment)
    return groups


def count_words(segments: dict[str, int], characters: set[str]) -> Counter:
    """Distinct words and their counts: a segment splits before each "▁" and around rare characters.

    {"▁the▁cat": 2, "▁the": 1} -> {"▁the": 3, "▁cat": 2}
    """
    inner = "".join(sorted(re.escape(char) for char in characters if char != SPACE))
    parts = [f"{SPACE}[{inner}]*"] if SPACE in characters else []  # a word starts at "▁" ...
    parts += [f"[{inner}]+"] if inner else []  # ... or at a segment's start or after a rare character
    if not parts:
        return Counter()
    word = re.compile("|".join(parts))
    words: Counter = Counter()
    for count, group in _by_count(segments).items():
        found = Counter(word.findall("\0".join(group)))  # "\0" is never a piece's character: a boundary
        if count == 1:
            words.update(found)
        else:
            words.update({text: times * count for text, times in found.items()})
    return words


# ---------------------------------------------------------------- 4. which pieces may exist


def _script_table() -> tuple[regex.Pattern, dict[str, str]]:
    """One pattern with a group per Unicode script, from the `regex` package's own Unicode data."""
    try:  # the public API matches a script by name, but does not list the names
        from regex._regex_core import PROPERTIES

        _, values = PROPERTIES["SCRIPT"]
    except (ImportError, KeyError, TypeError, ValueError) as error:
        raise GptlabError(f"this `regex` release ({regex.__version__}) does not list Unicode scripts as gptlab expects ({error!r}): "
                          "train with split_by_unicode_script=False, or install the release requirements.lock pins") from None
    names: dict[int, str] = {}
    for name, value in values.items():
        names.setdefault(value, name)
    pattern = regex.compile("|".join(f"(?P<s{value}>\\p{{Script={name}}})" for value, name in names.items()))
    return pattern, {f"s{value}": name for value, name in names.items()}


@functools.cache
def script_of(char: str) -> str:
    """The char's script as the library compares them: hiragana, katakana and "ー" count as Han."""
    pattern, names = _scripts()
    match = pattern.match(char)
    name = names[match.lastgroup] if match else "UNKNOWN"
    return "HAN" if name in ("HIRAGANA", "KATAKANA") or char == "\u30fc" else name


_scripts = functools.cache(_script_table)


@dataclass(frozen=True)
class PieceRules:
    """Which strings may become pieces (TrainerInterface::IsValidSentencePiece, for "▁" as a prefix)."""

    max_length: int
    split_digits: bool
    split_by_script: bool

    def __call__(self, piece: str) -> bool:
        if len(piece) > self.max_length:
            return False
        previous = None  # the script so far; None: any
        for position, char in enumerate(piece):
            if char in " \t\0":
                return False
            if char == SPACE:
                if position > 0:  # "▁" only starts a piece
                    return False
                continue
            if self.split_digits and len(piece) > 1 and unicodedata.category(char) == "Nd":
                return False
            script = script_of(char)
            if script == "INHERITED":  # combining marks belong to the letter before them
                script = previous
            if self.split_by_script and script is not None and previous is not None and script != previous:
                return False
            previous = script
        return True

    def traits(self, char: str) -> tuple[int, str | None]:
        """(flags, script) of one character: what the compiled learner needs to judge any pair of pieces.

        BLOCKED: in no longer piece (a digit with split_digits, a space, tab or NUL); HAS_SPACE: "▁", so
        only at a piece's start; script: None for "▁", combining marks (they take the script before them)
        and everything when scripts may mix. A join is valid when neither half is blocked, the right holds no
        "▁", the length fits, and the left's last script equals the right's first (or either is None).
        """
        if char == SPACE:
            return HAS_SPACE, None
        blocked = char in " \t\0" or (self.split_digits and unicodedata.category(char) == "Nd")
        script = script_of(char) if self.split_by_script else None
        return BLOCKED if blocked else 0, None if script == "INHERITED" else script


# ---------------------------------------------------------------- 4. merging


def _heap_entry(count: int, text: str, pair: tuple[int, int]) -> tuple:
    """Most frequent first; ties go to the shorter piece, then the smaller string (the library's order)."""
    return (-count, len(text), text, pair)


def learn_pieces(words: Counter, n_pieces: int, valid, *, progress: bool = False) -> list[str]:
    """Up to `n_pieces` new pieces (length >= 2) in merge order, from word counts; `valid(text)` says which may exist.

    {"▁aab": 2, "▁ab": 1} with n_pieces 1 -> ["▁a"] (pairs: ▁a 3, ab 3, aa 2; "▁a" < "ab")
    """
    texts: list[str] = []  # symbol id -> text
    ids: dict[str, int] = {}

    def symbol(text: str) -> int:
        if text not in ids:
            ids[text] = len(texts)
            texts.append(text)
        return ids[text]

    entries = sorted(word for word in words if len(word) > 1)
    sequences = [[symbol(char) for char in word] for word in entries]
    counts = [words[word] for word in entries]
    allowed: dict[tuple[int, int], bool] = {}

    def mergeable(pair: tuple[int, int]) -> bool:
        if pair not in allowed:
            allowed[pair] = valid(texts[pair[0]] + texts[pair[1]])
        return allowed[pair]

    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    pair_words: dict[tuple[int, int], set[int]] = defaultdict(set)
    for index, (sequence, count) in enumerate(zip(sequences, counts)):
        for pair in zip(sequence, sequence[1:]):
            if mergeable(pair):
                pair_counts[pair] += count
                pair_words[pair].add(index)
    heap = [_heap_entry(count, texts[a] + texts[b], (a, b)) for (a, b), count in pair_counts.items()]
    heapq.heapify(heap)

    pieces: list[str] = []
    with tqdm(total=n_pieces, desc="pieces", unit="piece", disable=not progress) as bar:
        while len(pieces) < n_pieces and heap:
            negative_count, _, text, pair = heapq.heappop(heap)
            current = pair_counts.get(pair, 0)
            if current != -negative_count:  # stale: the count dropped since this entry was pushed
                if current > 0:
                    heapq.heappush(heap, _heap_entry(current, text, pair))
                continue
            if text not in ids:  # else "aaa" again, from "a" + "aa" after "aa" + "a": one piece, merged into
                pieces.append(text)
                bar.update(1)
            new = symbol(text)
            delta = _rewrite(sequences, counts, pair_words, pair, new, mergeable)
            pair_counts.pop(pair, None)
            for changed, change in delta.items():
                total = pair_counts.get(changed, 0) + change
                if total > 0:
                    pair_counts[changed] = total
                else:
                    pair_counts.pop(changed, None)
                if change > 0:  # only pairs holding the new symbol can rise
                    heapq.heappush(heap, _heap_entry(total, texts[changed[0]] + texts[changed[1]], changed))
    return pieces


def learn_pieces_fast(words: Counter, n_pieces: int, rules: PieceRules, *, progress: bool = False) -> list[str]:
    """`learn_pieces`, in C when it is built (_sptrain.c; the same pieces, tests/tokenizer/test_sp_train_native.py)."""
    module = native.sptrain()
    counts = np.fromiter(words.values(), np.int64, len(words)) if words else np.zeros(0, np.int64)
    lengths = np.fromiter(map(len, words), np.uint32, len(words))
    if module is None or not isinstance(rules, PieceRules) or int(counts.sum()) * int(lengths.max(initial=0)) >= 1 << 62:
        return learn_pieces(words, n_pieces, rules, progress=progress)  # no C, another rule, or counts that could overflow
    joined = "".join(words)  # words of one character have no pair: harmless; the order of words changes no count
    # Character ids may differ from learn_pieces' (it numbers them in sorted-word order): ids only break ties between
    # equal texts ("a"+"bc", "ab"+"c"), and there a character is never compared with another character.
    chars = list(dict.fromkeys(joined))
    codes = np.array([ord(char) for char in chars], np.uint32)
    order = np.argsort(codes)
    points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32)
    ids = order[np.searchsorted(codes, points, sorter=order)].astype(np.uint32)
    scripts: dict[str | None, int] = {None: -1}
    traits = []
    for char in chars:
        flags, script = rules.traits(char)
        number = scripts.setdefault(script, len(scripts) - 1)
        traits += [flags, number, number]  # flags, first script, last script
    with tqdm(total=n_pieces, desc="pieces", unit="piece", disable=not progress) as bar:
        pieces = module.learn(ids.tobytes(), lengths.tobytes(), counts.tobytes(), chars, traits, rules.max_length, n_pieces)
        bar.update(len(pieces))
    return pieces


def _rewrite(sequences, counts, pair_words, pair: tuple[int, int], new: int, mergeable) -> dict[tuple[int, int], int]:
    """Merge `pair` into `new` in the words holding it; return the net change of the (mergeable) pair counts."""
    delta: dict[tuple[int, int], int] = defaultdict(int)
    for index in pair_words.pop(pair, ()):
        sequence = sequences[index]
        merged = merge_pair(sequence, pair[0], pair[1], new)
        if len(merged) == len(sequence):  # the index is lazy: this word lost the pair earlier
            continue
        count = counts[index]
        for old in zip(sequence, sequence[1:]):
            if mergeable(old):
                delta[old] -= count
        for fresh in zip(merged, merged[1:]):
            if mergeable(fresh):
                delta[fresh] += count
                pair_words[fresh].add(index)
        sequences[index] = merged
    return delta


# ---------------------------------------------------------------- 5. the model file's trainer spec


def _trainer_proto(config: SentencePieceTrainerConfig, vocab_size: int) -> bytes:
    """A ModelProto holding only the TrainerSpec (sp_model.write_model adds pieces and normaliser), so the
    file records how it was trained and names its <unk>, <s> and </s> as the library's trainer would."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    spec = proto.trainer_spec
    spec.model_type = BPE
    spec.vocab_size = vocab_size
    spec.character_coverage = config.character_coverage
    spec.byte_fallback = config.byte_fallback
    spec.split_digits = config.split_digits
    spec.split_by_unicode_script = config.split_by_unicode_script
    spec.max_sentencepiece_length = config.max_piece_length
    spec.unk_id, spec.unk_piece = 0, UNK_PIECE
    controls = list(config.control_symbols)
    spec.bos_id = 1 + controls.index("<s>") if "<s>" in controls else -1
    spec.eos_id = 1 + controls.index("</s>") if "</s>" in controls else -1
    spec.pad_id = -1
    spec.control_symbols.extend(symbol for symbol in controls if symbol not in ("<s>", "</s>"))
    spec.user_defined_symbols.extend(config.user_defined_symbols)
    return proto.SerializeToString()
