"""Where encoding time goes: the pure-Python reference (cProfile) and the compiled core (by stages).

GPT-2's vocabulary (the dev extras' files) on Shakespeare's works joined (5.1 MB), one thread.

    .venv/bin/python bench/tokenizer_profile.py

Pure Python: one `encode` call on a fresh tokenizer (empty piece cache) under
cProfile, split into `regex` pre-tokenization (findall), BPE on pieces the
cache has not seen (`_encode_piece`, cumulative), and the rest (the loop over
pieces, cache lookups, list extends). cProfile slows Python calls more than C
ones, so the shares are approximate. Compiled: best of 5 of three calls that
each do one stage more: pre-tokenize and hash the pieces (PieceCounter.add),
+ vocabulary lookups and BPE with the ids in a C array (encode_packed),
+ the Python list of ids (encode).
"""

from __future__ import annotations

import cProfile
import pstats
import time

from machine import header


def best_of(call, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def profile_reference(tokenizer, text: str) -> None:
    from gptlab.tokenizer import Tokenizer, native

    with native.pure_python():
        reference = Tokenizer(tokenizer.vocab, tokenizer.merges, tokenizer.special_tokens, tokenizer.pattern)
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.runcall(reference.encode, text)
        total = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats
    regex_time = sum(entry[2] for (_, _, name), entry in stats.items() if "findall" in name)
    bpe_time = sum(entry[3] for (path, _, name), entry in stats.items() if name == "_encode_piece" and path.endswith("core.py"))
    rest = total - regex_time - bpe_time
    print(f"pure Python (cProfile, {total:.2f} s in all):")
    for label, seconds in [("regex pre-tokenization", regex_time), ("BPE on cache misses", bpe_time), ("loop, cache lookups, list extends", rest)]:
        print(f"    {label:<36} {seconds:6.2f} s  {seconds / total:5.1%}")


def profile_compiled(tokenizer, text: str) -> None:
    from gptlab.tokenizer import native

    encoder = tokenizer._fast()
    scanner = native.scanner_id(tokenizer.pattern)
    scan = best_of(lambda: native.fastbpe().PieceCounter(scanner).add(text))
    packed = best_of(lambda: encoder.encode_packed([text]))
    full = best_of(lambda: encoder.encode(text))
    n_bytes = len(text.encode("utf-8"))
    print(f"compiled core (best of 5; encode {full * 1e3:.0f} ms, {n_bytes / full / 1e6:.1f} MB/s):")
    for label, seconds in [
        ("pre-tokenize + hash the pieces", scan),
        ("vocabulary lookups + BPE", packed - scan),
        ("Python list of ids", full - packed),
    ]:
        print(f"    {label:<36} {seconds * 1e3:6.1f} ms  {seconds / full:5.1%}")


def main() -> None:
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.tokenizer.pretrained import load_pretrained

    print(header("Where tokenizer encoding time goes (GPT-2, Shakespeare, one thread)", ["gptlab", "regex"]))
    text = "".join(shakespeare_documents())
    tokenizer = load_pretrained("gpt2")
    profile_reference(tokenizer, text)
    profile_compiled(tokenizer, text)


if __name__ == "__main__":
    main()
