"""SentencePiece BPE encoding: gptlab vs the `sentencepiece` library, same model and text, one thread each.

    .venv/bin/python bench/tokenizer_sentencepiece.py                 # best of 5 rounds; writes docs/bench_tokenizer_sentencepiece.txt
    .venv/bin/python bench/tokenizer_sentencepiece.py --repeats 2 --output -   # quicker, noisier, writes nothing

Models, trained here by the library on Shakespeare's works (the built-in corpus, 5 MB), 8,000 pieces each:
- llama: Llama 2's options: identity normaliser, dummy prefix, extra whitespace kept, digits split, byte fallback;
- nfkc: the library's defaults (nmt_nfkc normaliser, extra whitespace removed, no byte fallback);
- multi: Llama 2's options trained on the multilingual text below (accented Latin, Cyrillic, Greek, Arabic,
  CJK + Hangul, emoji, code), so that text is encoded by a model made for it.
Texts: Shakespeare's works joined (5 MB) and about 1 MB of multilingual text (bench/tokenizer_encode.py's).

Rows, each the best of N rounds that interleave the two libraries:
- text: one call on the whole text. gptlab `SentencePieceTokenizer.encode(text)` (normalise in Python, BPE in
  spbpe.c); the library `encode(text)`.
- lines: the text's lines as one list. gptlab `encode_many(lines)`; the library `encode(lines, num_threads=1)`.
- core: gptlab's compiled BPE alone (`_spbpe.Encoder.encode`) on the library's own normalised text: the part
  of the time that is BPE.
The headline ratio divides gptlab's whole-text time into the library's faster mode (text or lines).
MB/s counts UTF-8 input bytes, 1 MB = 10^6 bytes. Every gptlab id list is checked against the library's first.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path

from machine import header
from tokenizer_encode import multilingual_documents

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT = REPO_ROOT / "docs" / "bench_tokenizer_sentencepiece.txt"
VOCAB_SIZE = 8000
LLAMA_OPTIONS = {
    "normalization_rule_name": "identity", "add_dummy_prefix": True, "remove_extra_whitespaces": False, "split_digits": True,
    "byte_fallback": True,
}


def train(lines: list[str], **options) -> bytes:
    """A BPE `.model` (bytes) the library trains on `lines`, one thread."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(line for line in lines if line.strip()), model_writer=model, model_type="bpe",
        vocab_size=VOCAB_SIZE, num_threads=1, minloglevel=3, hard_vocab_limit=False, **options,
    )
    return model.getvalue()


def timed(call: Callable[[], list]) -> tuple[float, list]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def sides(model: bytes, text: str) -> dict[tuple[str, str], tuple[Callable[[], list], list]]:
    """(mode, library) -> (the call, the ids it must give); the library's results are the reference."""
    import sentencepiece as spm

    from gptlab.tokenizer import native
    from gptlab.tokenizer.sentencepiece import SentencePieceTokenizer
    from gptlab.tokenizer.sp_model import parse_model

    library = spm.SentencePieceProcessor(model_proto=model)
    ours = SentencePieceTokenizer(parse_model(model))
    core, normalized = ours._fast(), library.normalize(text)
    if core is None or native.spbpe() is None:
        raise SystemExit("the compiled core is not built: run `.venv/bin/python setup.py build_ext --inplace` first")
    lines = text.splitlines()
    whole, per_line = library.encode(text), library.encode(lines, num_threads=1)
    return {
        ("text", "sentencepiece"): (lambda: library.encode(text), whole),
        ("text", "gptlab"): (lambda: ours.encode(text), whole),
        ("lines", "sentencepiece"): (lambda: library.encode(lines, num_threads=1), per_line),
        ("lines", "gptlab"): (lambda: ours.encode_many(lines), per_line),
        ("core", "gptlab"): (lambda: core.encode(normalized), whole),
    }


def bench(name: str, model: bytes, text_name: str, text: str, repeats: int) -> list[str]:
    """Lines for one model and one text."""
    n_bytes = len(text.encode("utf-8"))
    label = f"{name:<6} {text_name} {n_bytes / 1e6:.1f}MB"
    calls = sides(model, text)
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeats):  # rounds interleave the libraries, so a noisy moment does not hit one only
        for key, (call, expected) in calls.items():
            seconds, result = timed(call)
            if result != expected:
                raise AssertionError(f"{label} {key}: gptlab's ids differ from the library's")
            best[key] = min(best[key], seconds)
    rate = {key: n_bytes / seconds / 1e6 for key, seconds in best.items()}
    lines = []
    for mode in ("text", "lines"):
        ours, theirs = rate[(mode, "gptlab")], rate[(mode, "sentencepiece")]
        lines.append(f"{label:<26} {mode:<5}  gptlab {ours:6.2f} MB/s  sentencepiece {theirs:6.2f} MB/s  ratio {ours / theirs:5.2f}")
    library_best = max(rate[("text", "sentencepiece")], rate[("lines", "sentencepiece")])
    lines.append(f"{label:<26} core   gptlab BPE alone {rate[('core', 'gptlab')]:6.2f} MB/s (the library's normalised text)")
    lines.append(f"{label:<26} headline  gptlab text {rate[('text', 'gptlab')]:6.2f} MB/s  vs the library's faster mode "
                 f"{library_best:6.2f} MB/s  ratio {rate[('text', 'gptlab')] / library_best:5.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds of measurements; the best of each is shown")
    parser.add_argument("--output", help=f"also write the output here (default {OUTPUT.relative_to(REPO_ROOT)}; - for none)")
    args = parser.parse_args()
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.runtime import atomic_write_text

    texts = {"shakespeare": "".join(shakespeare_documents()), "multilingual": "".join(multilingual_documents())}
    out = [header("SentencePiece BPE encoding: gptlab vs the sentencepiece library, same model and text, one thread",
                  ["sentencepiece", "gptlab"])]
    out.append(f"# models: {VOCAB_SIZE} pieces trained by the library: llama (Llama 2 options, byte fallback) and nfkc (defaults) "
               "on shakespeare; multi (Llama 2 options) on multilingual")
    out.append(f"# {args.repeats} rounds, libraries interleaved; best of the rounds shown. ratio = gptlab MB/s / sentencepiece MB/s")
    print("\n".join(out), flush=True)
    models = {
        "llama": (train(texts["shakespeare"].splitlines(), **LLAMA_OPTIONS), ["shakespeare", "multilingual"]),
        "nfkc": (train(texts["shakespeare"].splitlines()), ["shakespeare", "multilingual"]),
        "multi": (train(texts["multilingual"].splitlines(), **LLAMA_OPTIONS), ["multilingual"]),
    }
    for name, (model, text_names) in models.items():
        for text_name in text_names:
            lines = bench(name, model, text_name, texts[text_name], args.repeats)
            print("\n".join(lines), flush=True)
            out += lines
    out.append("ids identical: yes (every gptlab result above equals the library's)")
    print(out[-1])
    if args.output != "-":
        atomic_write_text(Path(args.output) if args.output else OUTPUT, "\n".join(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
