"""SentencePiece `.model` files: reading them into plain dataclasses, and writing them back.

A `.model` file is a protobuf `ModelProto` (sentencepiece_model.proto): the pieces in id
order, each with a score and a type, a TrainerSpec (the options training used, some of
which encoding honours: byte fallback, whitespace as suffix, the unknown piece's surface)
and a NormalizerSpec (the precompiled normalisation map and the whitespace rules).

The protobuf is parsed by the `sentencepiece` package's own generated module
(`sentencepiece_model_pb2`, which runs on `protobuf`): no wire format is parsed by hand here.
Only BPE models are read; unigram, word and char models are refused by name.

Not here: normalising (gptlab.tokenizer.sp_normalize), encoding (gptlab.tokenizer.sentencepiece),
training (gptlab.tokenizer.sp_train).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from gptlab.runtime import GptlabError, atomic_write_bytes

# piece types, as sentencepiece_model.proto numbers them
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
TYPE_NAMES = {NORMAL: "normal", UNKNOWN: "unknown", CONTROL: "control", USER_DEFINED: "user_defined", UNUSED: "unused", BYTE: "byte"}
MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}
BPE = 2
UNK_SURFACE = " \u2047 "  # what <unk> decodes to unless the model says otherwise
SPACE = "\u2581"  # "▁", the escaped space


@dataclass(frozen=True)
class Piece:
    """One vocabulary entry: its text ("▁the", "<0x0A>", "<s>"), score (higher merges first) and type."""

    text: str
    score: float = 0.0
    kind: int = NORMAL


@dataclass(frozen=True)
class NormalizerSpec:
    """How text is normalised before encoding (NormalizerSpec in the proto)."""

    name: str = "identity"  # the rule set the charsmap was compiled from: identity, nfkc, nmt_nfkc, nmt_nfkc_cf, ...
    charsmap: bytes = b""  # precompiled_charsmap: a double-array trie of rewrites (empty: no rewriting)
    add_dummy_prefix: bool = True  # a "▁" before the text, so a first word looks like any other
    remove_extra_whitespaces: bool = True  # strip leading/trailing spaces, collapse runs to one
    escape_whitespaces: bool = True  # spaces become "▁"


@dataclass(frozen=True)
class SentencePieceModel:
    """Everything a BPE `.model` decides about ids, plus the raw proto so saving keeps the rest."""

    pieces: tuple[Piece, ...]
    normalizer: NormalizerSpec = NormalizerSpec()
    denormalizer: NormalizerSpec | None = None  # applied when decoding; rare (None: none)
    byte_fallback: bool = False  # characters no piece covers become <0xNN> byte pieces instead of <unk>
    treat_whitespace_as_suffix: bool = False  # "▁" ends words instead of starting them
    unk_surface: str = UNK_SURFACE
    trainer: dict = field(default_factory=dict)  # other TrainerSpec fields worth keeping (vocab_size, character_coverage...)
    raw: bytes = b""  # the file's bytes (kept so a save preserves fields gptlab does not model)

    def ids_of(self, kind: int) -> list[int]:
        return [i for i, piece in enumerate(self.pieces) if piece.kind == kind]

    def with_pieces(self, pieces: tuple[Piece, ...]) -> SentencePieceModel:
        return replace(self, pieces=tuple(pieces))


def _pb2():
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as error:
        raise GptlabError(f"reading SentencePiece models needs the sentencepiece and protobuf packages ({error}): "
                          "pip install sentencepiece protobuf") from None
    return sentencepiece_model_pb2


def _normalizer(spec) -> NormalizerSpec:
    return NormalizerSpec(
        name=spec.name or "identity",
        charsmap=bytes(spec.precompiled_charsmap),
        add_dummy_prefix=spec.add_dummy_prefix,
        remove_extra_whitespaces=spec.remove_extra_whitespaces,
        escape_whitespaces=spec.escape_whitespaces,
    )


def parse_model(data: bytes, where: str = "the model") -> SentencePieceModel:
    """A SentencePieceModel from a `.model` file's bytes; refuses non-BPE models and non-models."""
    pb2 = _pb2()
    proto = pb2.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError and friends
        raise GptlabError(f"{where} is not a SentencePiece model ({error.__class__.__name__}: the protobuf does not parse)") from None
    if not proto.pieces:
        raise GptlabError(f"{where} is not a SentencePiece model: it holds no pieces")
    kind = proto.trainer_spec.model_type
    if kind != BPE:
        name = MODEL_TYPES.get(kind, str(kind))
        raise GptlabError(f"{where} is a SentencePiece {name.lower()} model (model_type {name}); gptlab reads BPE models only")
    trainer = proto.trainer_spec
    denormalizer = _normalizer(proto.denormalizer_spec) if proto.HasField("denormalizer_spec") else None
    if denormalizer is not None and not denormalizer.charsmap:
        denormalizer = None
    return SentencePieceModel(
        pieces=tuple(Piece(p.piece, p.score, p.type) for p in proto.pieces),
        normalizer=_normalizer(proto.normalizer_spec),
        denormalizer=denormalizer,
        byte_fallback=trainer.byte_fallback,
        treat_whitespace_as_suffix=trainer.treat_whitespace_as_suffix,
        unk_surface=trainer.unk_surface if trainer.HasField("unk_surface") else UNK_SURFACE,
        trainer={"vocab_size": trainer.vocab_size, "character_coverage": trainer.character_coverage},
        raw=bytes(data),
    )


def read_model(path: str | os.PathLike) -> SentencePieceModel:
    """Read a SentencePiece `.model` file (BPE only)."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"no SentencePiece model at {str(path)!r}: give the path of a .model file")
    return parse_model(path.read_bytes(), repr(str(path)))


def _fill_normalizer(target, spec: NormalizerSpec) -> None:
    target.name = spec.name
    target.precompiled_charsmap = spec.charsmap
    target.add_dummy_prefix = spec.add_dummy_prefix
    target.remove_extra_whitespaces = spec.remove_extra_whitespaces
    target.escape_whitespaces = spec.escape_whitespaces


def model_bytes(model: SentencePieceModel) -> bytes:
    """The `.model` bytes: the raw proto (if any) with pieces, normaliser and encoding options set from `model`."""
    pb2 = _pb2()
    proto = pb2.ModelProto()
    if model.raw:
        proto.ParseFromString(model.raw)
    del proto.pieces[:]
    for piece in model.pieces:
        proto.pieces.add(piece=piece.text, score=piece.score, type=piece.kind)
    trainer = proto.trainer_spec
    trainer.model_type = BPE
    trainer.vocab_size = len(model.pieces)
    trainer.byte_fallback = model.byte_fallback
    trainer.treat_whitespace_as_suffix = model.treat_whitespace_as_suffix
    trainer.unk_surface = model.unk_surface
    if "character_coverage" in model.trainer:
        trainer.character_coverage = model.trainer["character_coverage"]
    for kind, id_field, piece_field in ((UNKNOWN, "unk_id", "unk_piece"),):
        ids = model.ids_of(kind)
        setattr(trainer, id_field, ids[0] if ids else -1)
        if ids:
            setattr(trainer, piece_field, model.pieces[ids[0]].text)
    _fill_normalizer(proto.normalizer_spec, model.normalizer)
    if model.denormalizer is not None:
        _fill_normalizer(proto.denormalizer_spec, model.denormalizer)
    return proto.SerializeToString()


def write_model(model: SentencePieceModel, path: str | os.PathLike) -> Path:
    """Write `model` as a `.model` file the `sentencepiece` library loads (atomically)."""
    path = Path(path)
    atomic_write_bytes(path, model_bytes(model))
    return path
