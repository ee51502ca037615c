"""SentencePiece BPE (Llama 2, Mistral, Gemma style): a `.model` file in, the library's exact ids out.

Encoding is the library's three steps:

 1. normalise (gptlab.tokenizer.sp_normalize): the model's charsmap, its whitespace rules, spaces as
    "▁" and the dummy prefix: "Hello  world" -> "▁Hello▁world";
 2. BPE on code points, as src/bpe_model.cc does it: the text is cut into characters (user-defined
    pieces whole and frozen), then the adjacent pair whose join is a piece with the highest score is
    merged, leftmost first on ties, until no pair joins into a piece. Unused pieces are merged
    through and then split back into the parts they were made of;
 3. a piece with no id (a character the model never kept) becomes its UTF-8 bytes as <0xNN> pieces
    with byte fallback, else <unk>, one <unk> for a run of them (sentencepiece_processor.cc):

    "▁hi☃" -> [▁, h, i, ☃] -> [▁h, i, ☃] -> [▁hi, ☃] -> ids of ▁hi, <0xE2>, <0x98>, <0x83>

Decoding is DecodeIds: control pieces vanish, <unk> reads " ⁇ ", byte runs are joined and decoded
(each byte of a malformed sequence becomes U+FFFD), "▁" becomes a space and the dummy prefix's space
is dropped from the first piece. Control pieces (<s>, </s>, ...) are the special tokens; the library
reads their text as plain text, and so does `encode` unless asked otherwise.

The pure-Python `BPEEncoder` here is the readable reference; `gptlab.tokenizer._spbpe` (spbpe.c)
implements the same `Encoder(...)` in C and is used when built (tests prove the ids equal).

Not here: the file format (sp_model), normalising (sp_normalize), training (sp_train), Hugging Face
export (sp_huggingface).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import re
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from gptlab.runtime import GptlabError
from gptlab.tokenizer import native, parallel
from gptlab.tokenizer.sp_model import (
    BYTE,
    CONTROL,
    NORMAL,
    SPACE,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    Piece,
    SentencePieceModel,
    model_bytes,
    read_model,
    write_model,
)
from gptlab.tokenizer.sp_normalize import SentencePieceNormalizer
from gptlab.tokenizer.specials import AllowedSpecial, SpecialMatcher, raise_disallowed, resolve_special_sets

BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")  # the library's byte pieces: "<0x0A>"
MERGEABLE = (NORMAL, USER_DEFINED, UNUSED)  # the pieces BPE may produce (bpe_model.cc's pieces_); the rest are reserved
UTF8_LENGTH = [1] * 0xC0 + [2] * 0x20 + [3] * 0x10 + [4] * 0x08 + [1] * 0x08  # by lead byte; 1 for invalid leads


def check_pieces(pieces: Sequence[Piece], byte_fallback: bool) -> None:
    """Refuse a vocabulary the library refuses to load (model_interface.cc, InitializePieces)."""
    seen: dict[tuple[bool, str], int] = {}
    for i, piece in enumerate(pieces):
        if not piece.text:
            raise GptlabError(f"SentencePiece piece {i} is empty; every piece needs text")
        key = (piece.kind in MERGEABLE, piece.text)
        if key in seen:
            raise GptlabError(f"SentencePiece piece {piece.text!r} is defined twice (ids {seen[key]} and {i})")
        seen[key] = i
        if piece.kind == BYTE and (not byte_fallback or not BYTE_PIECE.fullmatch(piece.text)):
            raise GptlabError(f"SentencePiece byte piece {piece.text!r} (id {i}) needs byte_fallback and the form <0xNN>")
    if sum(piece.kind == UNKNOWN for piece in pieces) != 1:
        raise GptlabError("a SentencePiece model needs exactly one unknown piece (<unk>)")
    if byte_fallback and sum(piece.kind == BYTE for piece in pieces) != 256:
        raise GptlabError("a SentencePiece model with byte_fallback needs all 256 byte pieces <0x00>..<0xFF>")


class BPEEncoder:
    """The library's BPE on one normalised string (bpe_model.cc, then the unknown handling), in Python.

    Takes what spbpe.c's `Encoder` takes, so the two are interchangeable and comparable.
    """

    def __init__(self, pieces: list[str], scores: list[float], kinds: list[int], byte_fallback: bool, unk_id: int) -> None:
        self.scores = scores
        self.kinds = kinds
        self.byte_fallback = byte_fallback
        self.unk_id = unk_id
        self.mergeable = {text: i for i, (text, kind) in enumerate(zip(pieces, kinds)) if kind in MERGEABLE}
        self.reserved = {text: i for i, (text, kind) in enumerate(zip(pieces, kinds)) if kind not in MERGEABLE}
        self.byte_ids = {int(m.group(1), 16): i for i, text in enumerate(pieces) if kinds[i] == BYTE and (m := BYTE_PIECE.fullmatch(text))}
        user_defined = sorted((text for text, kind in zip(pieces, kinds) if kind == USER_DEFINED), key=len, reverse=True)
        self.user_defined = frozenset(user_defined)
        # longest user-defined piece first, else one character: the library's PrefixMatcher
        self.splitter = re.compile("|".join([re.escape(text) for text in user_defined] + ["."]), re.DOTALL)

    def piece_to_id(self, text: str) -> int:
        """ModelInterface::PieceToId: reserved pieces first, then the others, else <unk>."""
        found = self.reserved.get(text)
        return found if found is not None else self.mergeable.get(text, self.unk_id)

    def segment(self, normalized: str) -> list[tuple[str, int]]:
        """(piece, id) pairs of bpe_model.cc's SampleEncode with no dropout; id is <unk>'s for unknown pieces."""
        symbols = self.splitter.findall(normalized) if self.user_defined else list(normalized)
        frozen = [symbol in self.user_defined for symbol in symbols]
        after = list(range(1, len(symbols))) + [-1]  # linked list of the symbols still standing
        before = list(range(-1, len(symbols) - 1))
        agenda: list[tuple[float, int, int, int]] = []  # (-score, left, right, length): best score, then leftmost
        splits: dict[str, tuple[str, str]] = {}  # unused piece -> the pair last seen forming it

        def add_pair(left: int, right: int) -> None:
            if left < 0 or right < 0 or frozen[left] or frozen[right]:
                return
            joined = symbols[left] + symbols[right]
            i = self.mergeable.get(joined)
            if i is None:
                return
            heapq.heappush(agenda, (-self.scores[i], left, right, len(joined)))
            if self.kinds[i] == UNUSED:
                splits[joined] = (symbols[left], symbols[right])

        for i in range(1, len(symbols)):
            add_pair(i - 1, i)
        while agenda:
            _, left, right, length = heapq.heappop(agenda)
            # stale: one side was merged away, or the right side grew since this pair was queued
            if not symbols[left] or not symbols[right] or len(symbols[left]) + len(symbols[right]) != length:
                continue
            symbols[left], symbols[right] = symbols[left] + symbols[right], ""
            after[left] = after[right]
            if after[right] >= 0:
                before[after[right]] = left
            add_pair(before[left], left)
            add_pair(left, after[left])
        out: list[tuple[str, int]] = []
        for symbol in symbols:
            if symbol:
                self._resegment(symbol, splits, out)
        return out

    def _resegment(self, piece: str, splits: dict[str, tuple[str, str]], out: list[tuple[str, int]]) -> None:
        """An unused piece is split back into the pieces it was merged from, recursively."""
        i = self.piece_to_id(piece)
        if self.kinds[i] != UNUSED or piece not in splits:
            out.append((piece, i))
            return
        left, right = splits[piece]
        self._resegment(left, splits, out)
        self._resegment(right, splits, out)

    def encode(self, normalized: str) -> list[int]:
        """Ids of a normalised string: unknown pieces as their bytes (byte fallback) or one <unk> per run."""
        ids: list[int] = []
        previous_unknown = False
        for piece, i in self.segment(normalized):
            unknown = self.kinds[i] == UNKNOWN
            if unknown and self.byte_fallback:
                ids.extend(self.byte_ids[byte] for byte in piece.encode("utf-8", "surrogatepass"))
            elif not (unknown and previous_unknown):  # a run of unknown pieces is one <unk>
                ids.append(i)
            previous_unknown = unknown
        return ids

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]


def decode_byte_run(data: bytes) -> str:
    """Bytes of consecutive byte pieces as the library decodes them: each byte of a malformed sequence is one U+FFFD.

    (Python's "replace" would give one U+FFFD per malformed sequence: b"\\xe2\\x98" is "\\ufffd\\ufffd" here.)
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out, at = [], 0
    while at < len(data):
        length = UTF8_LENGTH[data[at]]
        try:
            out.append(data[at : at + length].decode("utf-8"))
            at += length
        except UnicodeDecodeError:  # truncated, overlong, a surrogate or past U+10FFFF: one byte consumed
            out.append("\ufffd")
            at += 1
    return "".join(out)


def _piece_bytes(piece: Piece) -> bytes:
    """What a piece stands for: "▁the" -> b" the", "<0x0A>" -> b"\\n"; control and unknown pieces -> their own text."""
    if piece.kind == BYTE:
        return bytes([int(piece.text[3:5], 16)])
    if piece.kind in (CONTROL, UNKNOWN):
        return piece.text.encode("utf-8")
    return piece.text.replace(SPACE, " ").encode("utf-8", "surrogatepass")


class SentencePieceTokenizer:
    """A SentencePiece BPE model with gptlab's tokenizer interface and the library's ids.

        >>> tok = SentencePieceTokenizer.from_file("tokenizer.model")  # doctest: +SKIP
        >>> tok.decode(tok.encode("Hello world"))  # doctest: +SKIP
        'Hello world'
    """

    FILE_NAME = "tokenizer.model"  # what `save` writes in a folder

    def __init__(self, model: SentencePieceModel) -> None:
        check_pieces(model.pieces, model.byte_fallback)
        self.model = model
        pieces = model.pieces
        self.special_tokens: dict[str, int] = {piece.text: i for i, piece in enumerate(pieces) if piece.kind == CONTROL}
        self.unk_id = model.ids_of(UNKNOWN)[0]
        self.vocab: dict[int, bytes] = {i: _piece_bytes(piece) for i, piece in enumerate(pieces)}
        self._encoder = BPEEncoder([p.text for p in pieces], [p.score for p in pieces], [p.kind for p in pieces], model.byte_fallback, self.unk_id)
        # decoding looks ids up again by their piece text (DecodeIds -> Decode(pieces)), reserved pieces first
        self._decode_kind = [pieces[self._encoder.piece_to_id(piece.text)].kind for piece in pieces]
        user_defined = [piece.text for piece in pieces if piece.kind == USER_DEFINED]
        options = {"treat_whitespace_as_suffix": model.treat_whitespace_as_suffix, "user_defined": user_defined}
        self._normalizer = SentencePieceNormalizer(model.normalizer, **options)
        # a denormaliser (rare: a model trained with decode rules) rewrites decoded text with its own spec's rules
        self._denormalizer = SentencePieceNormalizer(model.denormalizer) if model.denormalizer is not None else None
        self._native_encoder = None  # spbpe.c's Encoder, built on first use (see _fast)
        self._native_tried = False

    def __getstate__(self) -> dict:
        """Pickled (for worker processes) as the model alone; everything else is rebuilt from it."""
        return {"model": self.model}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model"])

    def _fast(self):
        """The compiled encoder for this model, or None when only the pure-Python reference runs."""
        if not self._native_tried:
            module = native.spbpe()
            if module is not None:
                pieces = self.model.pieces
                self._native_encoder = module.Encoder(
                    [p.text for p in pieces], [p.score for p in pieces], [p.kind for p in pieces], self.model.byte_fallback, self.unk_id
                )
            self._native_tried = True
        return self._native_encoder

    def _bpe(self):
        return self._fast() or self._encoder

    # ------------------------------------------------------------ construction, files

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> SentencePieceTokenizer:
        """Load a SentencePiece BPE `.model` file (unigram, word and char models are refused)."""
        return cls(read_model(path))

    def save(self, directory: str | os.PathLike) -> Path:
        """Write DIR/tokenizer.model, a file the `sentencepiece` library loads (control pieces added here included)."""
        return write_model(self.model, Path(directory) / self.FILE_NAME)

    def file_bytes(self) -> bytes:
        """The bytes `save` writes to DIR/FILE_NAME."""
        return model_bytes(self.model)

    def save_huggingface_dir(self, directory: str | os.PathLike, *, model_max_length: int | None = None,
                             chat_template: str | None = None) -> Path:
        """Write a Llama-style folder that `transformers.AutoTokenizer.from_pretrained` loads with the same ids."""
        from gptlab.tokenizer.sp_huggingface import save_huggingface_dir

        return save_huggingface_dir(self, directory, model_max_length=model_max_length, chat_template=chat_template)

    def with_special_tokens(self, tokens: Sequence[str]) -> SentencePieceTokenizer:
        """This tokenizer plus control pieces (score 0) at the next free ids; existing ids never move."""
        ids_of = {piece.text: i for i, piece in enumerate(self.model.pieces)}
        added = []
        for token in dict.fromkeys(tokens):
            if token in self.special_tokens:
                continue
            if not token:
                raise GptlabError("a special token cannot be empty")
            if token in ids_of:
                raise GptlabError(f"{token!r} is already piece {ids_of[token]} of this SentencePiece model (not a control piece); pick another special token")
            added.append(Piece(token, 0.0, CONTROL))
        if not added:
            return self
        return SentencePieceTokenizer(self.model.with_pieces(self.model.pieces + tuple(added)))

    # ------------------------------------------------------------ properties

    def piece(self, i: int) -> str:
        """The piece text of id `i` ("▁the", "<0x0A>", "<s>")."""
        self._check_ids([i])
        return self.model.pieces[i].text

    @property
    def vocab_size(self) -> int:
        return len(self.model.pieces)

    @property
    def eot_id(self) -> int | None:
        """Id of the end-of-text token ("</s>" in SentencePiece models), if any."""
        for name in ("</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot|>"):
            if name in self.special_tokens:
                return self.special_tokens[name]
        return None

    @property
    def bos_id(self) -> int | None:
        """Id of the beginning-of-text token "<s>", if any (encode adds none, as the library's default)."""
        return self.special_tokens.get("<s>")

    def fingerprint(self) -> str:
        """A short hash of everything that decides the ids, to tie data shards to their tokenizer."""
        model = self.model
        normalizers = [model.normalizer, model.denormalizer]
        settings = [
            [[spec.name, hashlib.sha256(spec.charsmap).hexdigest(), spec.add_dummy_prefix, spec.remove_extra_whitespaces,
              spec.escape_whitespaces] if spec else None for spec in normalizers],
            model.byte_fallback, model.treat_whitespace_as_suffix, model.unk_surface,
            [[piece.text, piece.score, piece.kind] for piece in model.pieces],
        ]
        return hashlib.sha256(json.dumps(["sentencepiece", settings]).encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return (
            f"SentencePieceTokenizer(vocab_size={self.vocab_size}, normalizer={self.model.normalizer.name!r}, "
            f"byte_fallback={self.model.byte_fallback}, special_tokens={len(self.special_tokens)})"
        )

    # ------------------------------------------------------------ encoding

    def normalize(self, text: str) -> str:
        """The string BPE sees: "Hello  world" -> "▁Hello▁world" (the library's `normalize`)."""
        return self._normalizer.normalize(text)

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode text as the library's `encode(text)` does: control pieces' text is plain text."""
        return self._bpe().encode(self._normalizer.normalize(text))

    def encode(
        self,
        text: str,
        *,
        allowed_special: AllowedSpecial = frozenset(),
        disallowed_special: AllowedSpecial = (),
    ) -> list[int]:
        """Encode text to ids; by default exactly the library's `encode(text)` (no <s>, control text as plain text).

        `allowed_special` control pieces (e.g. {"</s>"} or "all") in the text become their ids, and each stretch of
        text between them is encoded as the library encodes it alone (dummy prefix included), as the Hugging Face
        export (sp_huggingface) does. `disallowed_special` ones raise, as in tiktoken.
        """
        allowed, disallowed = resolve_special_sets(self.special_tokens, allowed_special, disallowed_special)
        if disallowed:
            found = SpecialMatcher(disallowed).search(text)
            if found is not None:
                raise_disallowed(found)
        if not allowed:
            return self.encode_ordinary(text)
        out: list[int] = []
        for part, special in SpecialMatcher(allowed).split(text):
            out.extend([self.special_tokens[part]] if special else self.encode_ordinary(part))
        return out

    def encode_many(
        self,
        texts: Sequence[str],
        *,
        allowed_special: AllowedSpecial = frozenset(),
        disallowed_special: AllowedSpecial = (),
    ) -> list[list[int]]:
        """`encode` on each text, in this thread (one compiled call when no control piece is allowed)."""
        allowed, disallowed = resolve_special_sets(self.special_tokens, allowed_special, disallowed_special)
        if allowed:
            return [self.encode(text, allowed_special=allowed, disallowed_special=disallowed) for text in texts]
        if disallowed:
            matcher = SpecialMatcher(disallowed)
            for text in texts:
                found = matcher.search(text)
                if found is not None:
                    raise_disallowed(found)
        return self._bpe().encode_many(self._normalizer.normalize_many(texts))

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        workers: int | None = None,
        allowed_special: AllowedSpecial = frozenset(),
        disallowed_special: AllowedSpecial = (),
    ) -> list[list[int]]:
        """Encode many texts, over all cores when the batch is large enough to pay for it."""
        return parallel.encode_batch(
            self, texts, workers=workers, allowed_special=allowed_special, disallowed_special=disallowed_special
        )

    def encode_iterable(
        self,
        texts: Iterable[str],
        *,
        allowed_special: AllowedSpecial = frozenset(),
        disallowed_special: AllowedSpecial = (),
    ) -> Iterator[int]:
        """Ids of the concatenation of `texts`: exactly `encode("".join(texts))`.

        Unlike the byte-level Tokenizer, memory is NOT bounded: SentencePiece has no pre-split, so a merge may
        reach across any boundary and whitespace rules see the whole text; the texts are joined first.
        """
        yield from self.encode("".join(texts), allowed_special=allowed_special, disallowed_special=disallowed_special)

    def encode_ordinary_packed(self, texts: Sequence[str]) -> tuple[array, list[int]]:
        """Encode many texts as ordinary text into one array('I') of ids back to back, and each text's count."""
        packed, counts = array("I"), []
        for ids in self._bpe().encode_many(self._normalizer.normalize_many(texts)):
            packed.extend(ids)
            counts.append(len(ids))
        return packed, counts

    # ------------------------------------------------------------ decoding

    def _check_ids(self, ids: list) -> None:
        size = len(self.model.pieces)
        bad = next((i for i in ids if not isinstance(i, int) or not 0 <= i < size), None)
        if bad is not None:
            raise GptlabError(f"unknown token id {bad!r}: this SentencePiece model's ids run 0..{size - 1}")

    def _decode_parts(self, ids: Iterable[int]) -> list[str | bytes]:
        """Decoded text in parts, runs of byte pieces left as bytes (sentencepiece_processor.cc, Decode).

        The dummy prefix: the first piece's leading "▁" is dropped when the model adds one (or removes
        extra whitespace); control pieces before it ("<s>") do not count.
        """
        ids = list(ids)
        self._check_ids(ids)
        spec, pieces, kinds = self.model.normalizer, self.model.pieces, self._decode_kind
        strip_first = spec.add_dummy_prefix or spec.remove_extra_whitespaces
        parts: list[str | bytes] = []
        run = bytearray()
        at_start, stripped, written = True, False, False
        for i in ids:
            kind = kinds[i]
            if kind == BYTE:
                run.append(self.vocab[i][0])
                continue
            if run:
                parts.append(bytes(run))
                run.clear()
                written = True
            if stripped or written:
                at_start = False
            text, stripped = self._decode_piece(pieces[i].text, kind, at_start and strip_first)
            if spec.remove_extra_whitespaces:
                stripped = False  # every leading "▁" is dropped, not just the first
            parts.append(text)
            written = written or bool(text)
        if run:
            parts.append(bytes(run))
        return parts

    def _decode_piece(self, text: str, kind: int, strip: bool) -> tuple[str, bool]:
        """A piece's text and whether it consumed the dummy prefix's "▁"."""
        if kind == CONTROL:
            return "", False
        if kind == UNKNOWN:
            return self.model.unk_surface, False
        stripped = strip and text.startswith(SPACE)
        if stripped:
            text = text[1:]
        return text.replace(SPACE, " "), stripped

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text, exactly as the library's `decode`."""
        text = "".join(part if isinstance(part, str) else decode_byte_run(part) for part in self._decode_parts(ids))
        if self._denormalizer is not None:
            text = self._denormalizer.normalize(text)
        return text

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes `decode` reads before it replaces malformed UTF-8 (and before any denormaliser)."""
        return b"".join(part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass") for part in self._decode_parts(ids))

    def token_bytes(self, i: int) -> bytes:
        """The bytes one id stands for: "▁the" -> b" the", "<0xE2>" -> b"\\xe2", "<s>" -> b"<s>"."""
        self._check_ids([i])
        return self.vocab[i]
