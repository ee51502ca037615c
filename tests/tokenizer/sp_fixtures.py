"""SentencePiece models for tests, trained by the `sentencepiece` library itself (the reference) under a tmp folder.

    path = train_model(tmp_path, vocab_size=400, byte_fallback=True)
    reference = spm.SentencePieceProcessor(model_file=str(path))

`train_model` reuses a model already in the folder with the same options (the file is named by their hash),
so the tests of a module share one model per option set (`model_maker`); training one takes ~0.02-0.3 s. Shared by every
SentencePiece test module: import from here, read-only.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import sentencepiece as spm

# Short real texts in many scripts, plus emoji (ZWJ families, flags, skin tones) and rare code points.
SCRIPT_SAMPLES = {
    "latin": "The quick brown fox jumps over the lazy dog. Café naïve façade, Straße, Ærøskøbing.",
    "cyrillic": "Съешь же ещё этих мягких французских булок, да выпей чаю. Привет, мир!",
    "greek": "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Γειά σου κόσμε!",
    "arabic": "مرحبا بالعالم، هذه تجربة للنص العربي مع التشكيل: كِتَابٌ",
    "hebrew": "שלום עולם, זוהי בדיקה של טקסט בעברית.",
    "devanagari": "नमस्ते दुनिया, यह हिन्दी में एक परीक्षण है।",
    "thai": "สวัสดีชาวโลก นี่คือการทดสอบภาษาไทย",
    "cjk": "你好，世界。这是一个中文测试。日本語のテキストもあります。",
    "hangul": "안녕하세요 세계, 이것은 한국어 시험입니다.",
    "emoji": "emoji 😀 👩‍👩‍👧‍👦 👍🏽 🇫🇷🇯🇵 ❤️ 🏳️‍🌈",
    "rare": "astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 private \ue000 \U000f0000 \U0010fffd",
    "whitespace": "tabs\tand\t\ttabs, new\nlines\n\n, many     spaces   here",
}

# Text that exercises encoders: every script, runs of spaces, tabs and newlines, characters no model has seen.
PROBES = [
    "",
    " ",
    "   ",
    "\n",
    "hello",
    " hello world ",
    "Hello  world   and    more     spaces",
    "a\tb\t\tc\nd\n\ne\r\nf",
    "    leading and trailing    ",
    "☃ snowman ☃☃ and ⛄",  # likely unseen: bytes or <unk>
    "mixed: Привет world 你好 مرحبا 😀",
    "ﬁ ① Ａ１ ² x\u00a0y",  # NFKC folds these
    "<s> and </s> written as text",
    "\U0010ffff\U000e0001 \ue000\uf8ff",
    "👩‍👩‍👧‍👦🇫🇷 👍🏽",
    "ab" * 40,
] + list(SCRIPT_SAMPLES.values())


def corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Training sentences: the samples, and pseudo-words drawn from each script's own characters."""
    rng = random.Random(seed)
    alphabets = {name: sorted(set(text) - set(" \t\n")) for name, text in SCRIPT_SAMPLES.items()}
    out = []
    for index in range(lines):
        name = list(SCRIPT_SAMPLES)[index % len(SCRIPT_SAMPLES)]
        if index % 5 == 0:
            out.append(SCRIPT_SAMPLES[name])
            continue
        letters = alphabets[name]
        words = ["".join(rng.choice(letters[: 8 + index % 20]) for _ in range(rng.randint(1, 7))) for _ in range(rng.randint(3, 12))]
        out.append(" ".join(words))
    return out


def train_model(
    folder: Path,
    *,
    vocab_size: int = 400,
    byte_fallback: bool = False,
    character_coverage: float = 1.0,
    normalization_rule_name: str = "identity",
    user_defined_symbols: tuple[str, ...] = (),
    control_symbols: tuple[str, ...] = (),
    add_dummy_prefix: bool = True,
    remove_extra_whitespaces: bool = True,
    treat_whitespace_as_suffix: bool = False,
    model_type: str = "bpe",
    lines: int = 400,
) -> Path:
    """Train a model with the library into `folder` (named after a hash of the options) and return its path."""
    options = dict(
        vocab_size=vocab_size,
        byte_fallback=byte_fallback,
        character_coverage=character_coverage,
        normalization_rule_name=normalization_rule_name,
        user_defined_symbols=list(user_defined_symbols),
        control_symbols=list(control_symbols),
        add_dummy_prefix=add_dummy_prefix,
        remove_extra_whitespaces=remove_extra_whitespaces,
        treat_whitespace_as_suffix=treat_whitespace_as_suffix,
        model_type=model_type,
    )
    key = hashlib.sha256(json.dumps([options, lines]).encode()).hexdigest()[:12]
    path = Path(folder) / f"sp_{model_type}_{key}.model"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as writer:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(corpus(lines)), model_writer=writer, minloglevel=2, num_threads=1, **options
            )
    return path


def model_maker(tmp_path_factory):
    """`make(**options)` -> path of a library-trained model, in one tmp folder; a module's session fixture returns it:

        @pytest.fixture(scope="session")
        def sp_models(tmp_path_factory):
            return model_maker(tmp_path_factory)
    """
    folder = tmp_path_factory.mktemp("sp_models")
    return lambda **options: train_model(folder, **options)


def reference(path: Path):
    """The library's processor for a model file."""
    return spm.SentencePieceProcessor(model_file=str(path))
