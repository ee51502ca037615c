"""SentencePiece BPE training: gptlab vs the `sentencepiece` library, same corpus and options, one thread each.

    .venv/bin/python bench/tokenizer_sentencepiece_train.py                # best of 3 rounds; writes docs/bench_tokenizer_sentencepiece_train.txt
    .venv/bin/python bench/tokenizer_sentencepiece_train.py --repeats 1 --output -   # quicker, noisier, writes nothing

Corpus: Shakespeare's works (the built-in corpus, 5 MB), one sentence per line. Cases:
- llama 8K, llama 32K: Llama 2's options (identity normaliser, dummy prefix, extra whitespace kept, digits split,
  byte fallback, coverage 0.9995);
- nfkc 8K: the library's defaults (nmt_nfkc normaliser, extra whitespace removed, no byte fallback, digits kept whole).
gptlab: `train_sentencepiece([text], ...)` (normalising and counting in Python, merges in _sptrain.c);
the library: `SentencePieceTrainer.train(sentence_iterator=..., num_threads=1)`. Both times are wall clock for
the whole training, the model kept in memory. Rounds interleave the two; the best of each is shown.
ratio = gptlab seconds / library seconds (lower is better; 1.0 is parity). "pieces identical" compares every
piece and score of the two models.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

from machine import header

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT = REPO_ROOT / "docs" / "bench_tokenizer_sentencepiece_train.txt"
LLAMA = {
    "ours": {"normalizer": "identity", "remove_extra_whitespaces": False, "byte_fallback": True, "split_digits": True},
    "library": {"normalization_rule_name": "identity", "remove_extra_whitespaces": False, "byte_fallback": True, "split_digits": True},
}
NFKC = {
    "ours": {"normalizer": "nmt_nfkc", "remove_extra_whitespaces": True, "byte_fallback": False, "split_digits": False},
    "library": {},  # the library's defaults
}
CASES = {"llama 8K": (LLAMA, 8000), "llama 32K": (LLAMA, 32000), "nfkc 8K": (NFKC, 8000)}


def library_train(text: str, vocab_size: int, options: dict) -> list[tuple[str, float]]:
    import sentencepiece as spm

    from gptlab.tokenizer.sp_model import parse_model

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.split("\n")), model_writer=model, model_type="bpe", vocab_size=vocab_size, num_threads=1,
        minloglevel=3, **options,
    )
    return [(piece.text, piece.score) for piece in parse_model(model.getvalue()).pieces]


def gptlab_train(text: str, vocab_size: int, options: dict) -> list[tuple[str, float]]:
    from gptlab.tokenizer.sp_train import train_sentencepiece

    return [(piece.text, piece.score) for piece in train_sentencepiece([text], vocab_size=vocab_size, **options).pieces]


def bench(name: str, text: str, repeats: int) -> str:
    options, vocab_size = CASES[name]
    best = {"sentencepiece": float("inf"), "gptlab": float("inf")}
    pieces = {}
    for _ in range(repeats):  # interleaved, so a noisy moment does not hit one side only
        for side, train in (("sentencepiece", library_train), ("gptlab", gptlab_train)):
            start = time.perf_counter()
            pieces[side] = train(text, vocab_size, options["library" if side == "sentencepiece" else "ours"])
            best[side] = min(best[side], time.perf_counter() - start)
    same = "yes" if pieces["gptlab"] == pieces["sentencepiece"] else "NO"
    return (f"{name:<10} gptlab {best['gptlab']:6.2f} s  sentencepiece {best['sentencepiece']:6.2f} s  "
            f"ratio {best['gptlab'] / best['sentencepiece']:5.2f}  pieces identical: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of measurements; the best of each is shown")
    parser.add_argument("--output", help=f"also write the output here (default {OUTPUT.relative_to(REPO_ROOT)}; - for none)")
    args = parser.parse_args()
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.runtime import atomic_write_text
    from gptlab.tokenizer import native

    if native.sptrain() is None:
        raise SystemExit("the compiled core is not built: run `.venv/bin/python setup.py build_ext --inplace` first")
    text = "".join(shakespeare_documents())
    out = [header("SentencePiece BPE training: gptlab vs the sentencepiece library, same corpus and options, one thread",
                  ["sentencepiece", "gptlab"])]
    out.append(f"# corpus: shakespeare {len(text.encode('utf-8')) / 1e6:.1f} MB; {args.repeats} rounds, interleaved, best shown; "
               "ratio = gptlab s / sentencepiece s (lower is better)")
    print("\n".join(out), flush=True)
    for name in CASES:
        out.append(bench(name, text, args.repeats))
        print(out[-1], flush=True)
    if args.output != "-":
        atomic_write_text(Path(args.output) if args.output else OUTPUT, "\n".join(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
