"""The Tokenizer: byte-level BPE encoding and decoding, with tiktoken's special-token rules.

A tokenizer is a vocabulary (id -> bytes), an ordered list of merges (rank =
list order), special tokens (str -> id) and a split pattern. Encoding cuts
text at special tokens, splits it into pieces with the pattern, and applies
merges to each piece's bytes, lowest rank first, as GPT-2's encoder.py and
tiktoken do:

    pieces of "hello world": ["hello", " world"]
    b"hello": [h, e, l, l, o] -> [he, l, l, o] -> [he, ll, o] -> [hell, o] -> [hello]

Pieces repeat a lot in real text, so encoded pieces are cached. A tokenizer imported from Hugging Face
may declare a Unicode normal form (`normalizer`, e.g. "NFC"): the text between special tokens is then
normalised before it is split, as `tokenizers` does (gptlab.tokenizer.normalize); decoding is unchanged.

This file is the readable reference. When the compiled core is built
(gptlab.tokenizer.native), the same calls run in C and give the same ids:
`_encode_piece` and `split` here are what fastbpe.c implements.

Not here: training (gptlab.tokenizer.train), file formats (gptlab.tokenizer.formats, .huggingface).
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from gptlab.runtime import GptlabError
from gptlab.tokenizer import formats, huggingface, native, parallel
from gptlab.tokenizer.normalize import check_form, normalize, normalizing_take
from gptlab.tokenizer.patterns import SplitRegex, compile_pattern, pattern_name, resolve_pattern, split_stable
from gptlab.tokenizer.specials import AllowedSpecial, SpecialMatcher, raise_disallowed, resolve_special_sets
from gptlab.tokenizer.stream import stream_parts
from gptlab.tokenizer.train import count_words, fit_merges, merge_pair

CACHE_LIMIT = 1 << 20  # encoded pieces kept before the cache is cleared (bounds memory on huge corpora)


class Tokenizer:
    """Byte-level BPE. Build it from a vocabulary and merges, train it, or load it."""

    def __init__(
        self,
        vocab: Mapping[int, bytes],
        merges: Sequence[tuple[bytes, bytes]],
        special_tokens: Mapping[str, int] | Sequence[str] = (),
        pattern: str | None = "gpt4",
        *,
        normalizer: str | None = None,
    ) -> None:
        """`vocab` gives ids; `merges` are byte pairs in rank order; special tokens are text.

        Special tokens given as a list take their ids from `vocab` when it holds
        their bytes, else the next free ids. `normalizer` (NFC, NFKC, NFD, NFKD or
        None) is applied to the text between special tokens before splitting.
        """
        self.pattern = resolve_pattern(pattern)
        self.normalizer = check_form(normalizer)
        self.vocab: dict[int, bytes] = {int(i): bytes(token) for i, token in vocab.items()}
        self.special_tokens = self._place_special_tokens(special_tokens)
        self.merges: list[tuple[bytes, bytes]] = [(bytes(a), bytes(b)) for a, b in merges]
        ids_of = {token: i for i, token in self.vocab.items() if i not in self.special_tokens.values()}
        if len(ids_of) != len(self.vocab) - len(set(self.special_tokens.values()) & self.vocab.keys()):
            raise GptlabError("vocab maps two ids to the same bytes")
        missing = [byte for byte in range(256) if bytes([byte]) not in ids_of]
        if missing:
            raise GptlabError(f"vocab lacks {len(missing)} single-byte tokens (first: byte {missing[0]}); byte-level BPE needs all 256")
        self._byte_ids = [ids_of[bytes([byte])] for byte in range(256)]
        self._merge_table: dict[tuple[int, int], tuple[int, int]] = {}  # (left, right) -> (rank, merged id)
        for rank, (left, right) in enumerate(self.merges):
            for part in (left, right, left + right):
                if part not in ids_of:
                    raise GptlabError(f"merge {rank} ({left!r}, {right!r}) uses {part!r}, which is not in the vocab")
            self._merge_table.setdefault((ids_of[left], ids_of[right]), (rank, ids_of[left + right]))
        self._compiled = compile_pattern(self.pattern)
        self._all_specials = SpecialMatcher(self.special_tokens)
        self._cache: dict[str, list[int]] = {}
        self._scanner = native.scanner_id(self.pattern)  # the C pre-tokenizer for this pattern, if there is one
        self._native_encoder = None  # built on first use (see _fast)
        self._native_tried = False

    def __getstate__(self) -> dict:
        """Pickled for worker processes without the compiled encoder or the cache (rebuilt there)."""
        state = dict(self.__dict__)
        state.update(_cache={}, _native_encoder=None, _native_tried=False)
        return state

    def _fast(self):
        """The compiled encoder for this vocabulary, or None when only the pure-Python reference runs."""
        if not self._native_tried:
            module = native.fastbpe()
            if module is not None:
                ids_of = {token: i for i, token in self.vocab.items() if i not in self.special_tokens.values()}
                merges = [(left, right, merged) for (left, right), (_, merged) in self._merge_table.items()]
                self._native_encoder = module.Encoder(
                    self._byte_ids, merges, list(ids_of), self._scanner if self._scanner is not None else 0
                )
            self._native_tried = True
        return self._native_encoder

    def _place_special_tokens(self, special_tokens: Mapping[str, int] | Sequence[str]) -> dict[str, int]:
        if isinstance(special_tokens, Mapping):
            placed = {str(token): int(i) for token, i in special_tokens.items()}
        else:
            if len(set(special_tokens)) != len(special_tokens):
                raise GptlabError(f"special tokens repeat: {list(special_tokens)}")
            by_bytes = {token: i for i, token in self.vocab.items()}
            next_id = max(self.vocab, default=-1) + 1
            placed = {}
            for token in special_tokens:
                if token.encode("utf-8") in by_bytes:
                    placed[token] = by_bytes[token.encode("utf-8")]
                else:
                    placed[token], next_id = next_id, next_id + 1
        for token, i in placed.items():
            if not token:
                raise GptlabError("a special token cannot be empty")
            if self.vocab.setdefault(i, token.encode("utf-8")) != token.encode("utf-8"):
                raise GptlabError(f"special token {token!r} has id {i}, which the vocab gives to {self.vocab[i]!r}")
        if len(set(placed.values())) != len(placed):
            raise GptlabError(f"special tokens share ids: {placed}")
        return placed

    # ------------------------------------------------------------ properties

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included (max id + 1)."""
        return max(self.vocab) + 1

    @property
    def eot_id(self) -> int | None:
        """Id of the end-of-text / document separator token, if any."""
        for name in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|eot|>"):
            if name in self.special_tokens:
                return self.special_tokens[name]
        return None

    def fingerprint(self) -> str:
        """A short hash of everything that decides the ids, to tie data shards to their tokenizer."""
        digest = hashlib.sha256()
        settings = [self.pattern, sorted(self.special_tokens.items())]
        # a normaliser changes the ids; without one the hash stays what it was before normalisers existed
        digest.update(json.dumps(settings + [self.normalizer] if self.normalizer else settings).encode())
        for i in sorted(self.vocab):
            digest.update(i.to_bytes(4, "little") + len(self.vocab[i]).to_bytes(4, "little") + self.vocab[i])
        for left, right in self.merges:
            digest.update(len(left).to_bytes(4, "little") + left + right)
        return digest.hexdigest()[:16]

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
            f"special_tokens={len(self.special_tokens)}, pattern={pattern_name(self.pattern)!r}"
            + (f", normalizer={self.normalizer!r})" if self.normalizer else ")")
        )

    # ------------------------------------------------------------ encoding

    def _encode_piece(self, piece: str) -> list[int]:
        """BPE on one piece: repeatedly merge the adjacent pair of lowest rank (all its occurrences)."""
        ids = [self._byte_ids[byte] for byte in piece.encode("utf-8")]
        table = self._merge_table
        while len(ids) > 1:
            best = min(zip(ids, ids[1:]), key=lambda pair: table.get(pair, (1 << 62,))[0])
            found = table.get(best)
            if found is None:
                break
            ids = merge_pair(ids, best[0], best[1], found[1])
        return ids

    def _encode_pieces(self, pieces: Iterable[str], out: list[int]) -> None:
        fast = self._fast()
        if fast is not None:
            out.extend(fast.encode_pieces(pieces if isinstance(pieces, list) else list(pieces)))
            return
        cache = self._cache
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                ids = self._encode_piece(piece)
                if len(cache) >= CACHE_LIMIT:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)

    def _encode_text(self, text: str, final: bool = True) -> tuple[list[int], int]:
        """Ids of the text's pieces and the characters they cover; with `final` false, only the
        pieces that more text could not change (for streaming)."""
        fast = self._fast()
        if fast is not None and self._scanner is not None:
            return (fast.encode(text), len(text)) if final else fast.encode_stable(text)
        pieces, used = split_stable(text, self._compiled, final)
        out: list[int] = []
        self._encode_pieces(pieces, out)
        return out, used

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode text, treating special tokens as plain text."""
        return self._encode_text(normalize(text, self.normalizer))[0]

    def encode_ordinary_packed(self, texts: Sequence[str]) -> tuple[array, list[int]]:
        """Encode many texts as ordinary text into one array('I') of ids back to back, and each text's count.

        For data preparation: no Python list of ints is built on the compiled path.
        """
        fast = self._fast()
        if fast is not None and self._scanner is not None:
            ids, counts = fast.encode_packed([normalize(text, self.normalizer) for text in texts])
            return array("I", ids), counts
        packed, counts = array("I"), []
        for text in texts:
            ids = self.encode_ordinary(text)
            packed.extend(ids)
            counts.append(len(ids))
        return packed, counts

    def encode(
        self,
        text: str,
        *,
        allowed_special: AllowedSpecial = frozenset(),
        disallowed_special: AllowedSpecial = "all",
    ) -> list[int]:
        """Encode text to ids. As in tiktoken, text spelling a special token raises unless allowed."""
        allowed, disallowed = resolve_special_sets(self.special_tokens, allowed_special, disallowed_special)
        if disallowed:
            found = SpecialMatcher(disallowed).search(text)
            if found is not None:
                raise_disallowed(found)
        if not allowed:
            return self.encode_ordinary(text)
        out: list[int] = []
        for part, special in SpecialMatcher(allowed).split(text):
            if special:
                out.append(self.special_tokens[part])
            else:  # normalised apart from the special tokens, as `tokenizers` does
                out.extend(self._encode_text(normalize(part, self.normalizer))[0])
        return out

    def encode_iterable(
        self,
        texts: Iterable[str],
        *,
        allowed_special: AllowedSpecial = frozenset(),
        disallowed_special: AllowedSpecial = "all",
    ) -> Iterator[int]:
        """Lazily encode the concatenation of `texts` (e.g. a file's lines) with bounded memory.

        Gives exactly `encode("".join(texts))`.
        """
        allowed, disallowed = resolve_special_sets(self.special_tokens, allowed_special, disallowed_special)
        matcher = SpecialMatcher(allowed | disallowed)
        take = self._encode_text if self.normalizer is None else normalizing_take(self._encode_text, self.normalizer)
        for part, special in stream_parts(texts, matcher, take):
            if not special:
                yield from part
            elif part in disallowed:
                raise_disallowed(part)
            else:
                yield self.special_tokens[part]

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        workers: int | None = None,
        allowed_special: AllowedSpecial = frozenset(),
        disallowed_special: AllowedSpecial = "all",
    ) -> list[list[int]]:
        """Encode many texts, over all cores when the batch is large enough to pay for it."""
        return parallel.encode_batch(
            self, texts, workers=workers, allowed_special=allowed_special, disallowed_special=disallowed_special
        )

    def encode_many(
        self,
        texts: Sequence[str],
        *,
        allowed_special: AllowedSpecial = frozenset(),
        disallowed_special: AllowedSpecial = "all",
    ) -> list[list[int]]:
        """`encode` on each text, in this thread (one compiled call when no special token is allowed)."""
        fast = self._fast()
        allowed, disallowed = resolve_special_sets(self.special_tokens, allowed_special, disallowed_special)
        if fast is None or self._scanner is None or allowed:
            return [self.encode(text, allowed_special=allowed, disallowed_special=disallowed) for text in texts]
        if disallowed:
            matcher = SpecialMatcher(disallowed)
            for text in texts:
                found = matcher.search(text)
                if found is not None:
                    raise_disallowed(found)
        return fast.encode_many([normalize(text, self.normalizer) for text in texts])

    # ------------------------------------------------------------ decoding

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        vocab = self.vocab
        try:
            return b"".join([vocab[i] for i in ids])
        except (KeyError, TypeError):
            bad = next(i for i in ids if not isinstance(i, int) or i not in vocab)
            raise GptlabError(f"unknown token id {bad!r}: ids run 0..{self.vocab_size - 1} with gaps at unused ids") from None

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Decode ids to text; bytes that are not valid UTF-8 become U+FFFD, as in tiktoken."""
        return self.decode_bytes(list(ids)).decode("utf-8", errors=errors)

    def token_bytes(self, i: int) -> bytes:
        return self.decode_bytes([i])

    # ------------------------------------------------------------ construction, files, interop

    @classmethod
    def train(
        cls,
        texts: Iterable[str] | None = None,
        *,
        files: Sequence[str | os.PathLike] = (),
        vocab_size: int,
        pattern: str | None = "gpt4",
        special_tokens: Sequence[str] = ("<|endoftext|>",),
        workers: int | None = None,
        progress: bool = False,
    ) -> Tokenizer:
        """Train byte-level BPE on documents (`texts` and/or `files`); ids: bytes, merges, specials.

        `vocab_size` counts all ids. Special tokens in the text are boundaries no merge crosses.
        """

        special_tokens = list(dict.fromkeys(special_tokens))
        n_merges = vocab_size - 256 - len(special_tokens)
        if n_merges < 0:
            raise GptlabError(
                f"vocab_size {vocab_size} is too small: it must hold 256 byte tokens + {len(special_tokens)} special tokens"
            )
        if texts is None and not files:
            raise GptlabError("nothing to train on: give texts or files")
        regex_text = resolve_pattern(pattern)
        word_counts = count_words(
            texts=texts, files=files, pattern=regex_text, special_tokens=special_tokens, workers=workers, progress=progress
        )
        if not word_counts:
            raise GptlabError("the training corpus is empty (no text outside special tokens)")
        merges = fit_merges(word_counts, n_merges, progress=progress)
        vocab = {i: bytes([i]) for i in range(256)}
        for left, right in merges:
            vocab[len(vocab)] = left + right
        return cls(vocab, merges, list(special_tokens), regex_text)

    FILE_NAME = formats.FILE_NAME  # what `save` writes in a folder (a SentencePiece tokenizer writes tokenizer.model)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write gptlab's `DIR/tokenizer.json` (see gptlab.tokenizer.formats)."""
        return formats.save_tokenizer(self, directory)

    def file_bytes(self) -> bytes:
        """The bytes `save` writes to DIR/FILE_NAME (data preparation writes them only when they changed)."""
        return formats.tokenizer_file_text(self).encode("utf-8")

    def with_special_tokens(self, tokens: Sequence[str]) -> Tokenizer:
        """This tokenizer plus special tokens at the next free ids (those it has keep theirs); existing ids never move."""
        specials = dict(self.special_tokens)
        next_id = self.vocab_size
        for token in dict.fromkeys(tokens):
            if token not in specials:
                specials[token], next_id = next_id, next_id + 1
        if len(specials) == len(self.special_tokens):
            return self
        vocab = {i: token for i, token in self.vocab.items() if i not in self.special_tokens.values()}
        return Tokenizer(vocab, self.merges, specials, pattern=self.pattern, normalizer=self.normalizer)

    @classmethod
    def from_parts(cls, parts: formats.TokenizerParts) -> Tokenizer:
        """Build from what a file reader returns (vocab, merges, special tokens, pattern regex)."""
        pattern = None if parts.pattern is None else SplitRegex(parts.pattern)  # files store regex text, never names
        return cls(parts.vocab, parts.merges, parts.special_tokens, pattern, normalizer=parts.normalizer)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        """gptlab's own format: a directory holding `tokenizer.json`, or the file itself."""
        return cls.from_parts(formats.read_tokenizer_file(directory))

    @classmethod
    def from_gpt2_files(
        cls, encoder_json: str | os.PathLike, vocab_bpe: str | os.PathLike, pattern: str | None = "gpt2"
    ) -> Tokenizer:
        """GPT-2's `encoder.json` + `vocab.bpe` (ids identical to tiktoken's "gpt2")."""
        vocab, merges, special_tokens = formats.read_gpt2_files(encoder_json, vocab_bpe)
        return cls(vocab, merges, special_tokens, pattern)

    @classmethod
    def from_tiktoken_file(
        cls,
        path: str | os.PathLike,
        *,
        pattern: str | None = "gpt4",
        special_tokens: Mapping[str, int] | None = None,
    ) -> Tokenizer:
        """A tiktoken rank file (e.g. `cl100k_base.tiktoken`); merges are recovered from the ranks."""
        vocab, merges = formats.read_tiktoken_file(path)
        return cls(vocab, merges, special_tokens or {}, pattern)

    def to_tiktoken(self, name: str = "gptlab"):
        """A `tiktoken.Encoding` giving the same ids (needs the tiktoken package)."""
        return formats.to_tiktoken(self, name)

    def to_huggingface(self):
        """A Hugging Face `tokenizers.Tokenizer` giving the same ids (needs the tokenizers package)."""
        return huggingface.to_huggingface(self)

    def save_huggingface(self, path: str | os.PathLike) -> Path:
        """Write a Hugging Face `tokenizer.json` (the `tokenizers` file alone)."""
        return huggingface.save_huggingface(self, path)

    def save_huggingface_dir(self, directory: str | os.PathLike, *, model_max_length: int | None = None,
                             chat_template: str | None = None) -> Path:
        """Write a folder that `transformers.AutoTokenizer.from_pretrained` loads with the same ids."""
        return huggingface.save_huggingface_dir(self, directory, model_max_length=model_max_length, chat_template=chat_template)

    @classmethod
    def from_sentencepiece(cls, path: str | os.PathLike):
        """A SentencePiece BPE `.model` file (Llama 2 style), as a SentencePieceTokenizer: the library's ids, this interface."""
        from gptlab.tokenizer.sentencepiece import SentencePieceTokenizer  # imported on use: loading core needs no protobuf

        return SentencePieceTokenizer.from_file(path)

    @classmethod
    def from_huggingface(cls, path: str | os.PathLike) -> Tokenizer:
        """A byte-level BPE Hugging Face tokenizer: a folder (tokenizer.json, or vocab.json + merges.txt) or its tokenizer.json."""
        return cls.from_parts(huggingface.read_huggingface(path))
