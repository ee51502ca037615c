"""BPE training time and peak memory: gptlab vs Hugging Face `tokenizers` vs rustbpe, side by side.

Every trainer learns byte-level BPE with the GPT-4 split pattern on the same
documents. Each run happens in a fresh child process (this script, called
with --child), which times only the train call (imports and corpus loading
excluded) and reports its peak resident memory. The best time of --repeats
runs is shown, with the largest peak memory of those runs.

    .venv/bin/python bench/tokenizer_train.py             # all cases, best of 3
    .venv/bin/python bench/tokenizer_train.py --quick     # the small case and 4096 only
    .venv/bin/python bench/tokenizer_train.py --large-mb 200  # + 200 MB -> 32768, once

Peak memory is the peak RSS of the child itself (VmHWM) plus `ru_maxrss`
of its largest reaped child process (all three use threads; gptlab's
pure-Python reference would count in forked processes).

gptlab's compiled trainer must learn exactly the merges of its readable
pure-Python reference: each case also runs the reference once
(GPTLAB_PURE_PYTHON=1) and stops if a single merge differs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from machine import header

TRAINERS = ("gptlab", "hf-tokenizers", "rustbpe")
SHORT_NAMES = {"gptlab": "gptlab", "hf-tokenizers": "hf", "rustbpe": "rustbpe"}
SPECIAL_TOKENS = ["<|endoftext|>"]
SMALL_TARGET_BYTES = 133_000  # the "133 KB class" corpus: one work of about this size
CASES = [("small", 500), ("shakespeare", 4096), ("shakespeare", 32768)]


# ---------------------------------------------------------------- corpus


def load_corpus(name: str) -> tuple[str, list[str]]:
    """A label saying exactly what the corpus is, and its documents."""
    from gptlab.data.corpus import shakespeare_documents, shakespeare_files

    if name.startswith("mixed"):  # --large-mb: Shakespeare's paragraphs shuffled into documents (as bench/data_prepare.py)
        from data_prepare import mixed_documents

        size_mb = int(name.removeprefix("mixed"))
        documents = list(mixed_documents(size_mb * 1_000_000, seed=0))
        return f"shuffled Shakespeare paragraphs {size_mb} MB ({len(documents):,} documents)", documents
    documents = shakespeare_documents()
    if name == "shakespeare":
        size = sum(len(document.encode("utf-8")) for document in documents)
        return f"shakespeare {size / 1e6:.1f}MB ({len(documents)} works)", documents
    # The single work whose size is closest to the target, so the case is fixed by the corpus alone.
    sizes = [len(document.encode("utf-8")) for document in documents]
    index = min(range(len(documents)), key=lambda i: (abs(sizes[i] - SMALL_TARGET_BYTES), i))
    work = shakespeare_files()[index].stem
    return f"{work} {sizes[index] / 1e3:.1f}KB (1 work)", [documents[index]]


# ---------------------------------------------------------------- trainers (run in the child)


def own_peak_kib() -> int:
    """This process's peak RSS in KiB.

    VmHWM rather than ru_maxrss: Linux carries ru_maxrss across exec, so a
    child started by subprocess would report at least its parent's peak.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def train_gptlab(documents: list[str], vocab_size: int) -> tuple[float, int, list[bytes]]:
    from gptlab.tokenizer import Tokenizer

    start = time.perf_counter()
    tokenizer = Tokenizer.train(documents, vocab_size=vocab_size, pattern="gpt4", special_tokens=SPECIAL_TOKENS)
    seconds = time.perf_counter() - start
    return seconds, tokenizer.vocab_size, [left + right for left, right in tokenizer.merges]


def train_huggingface(documents: list[str], vocab_size: int) -> tuple[float, int, list[bytes]]:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    from gptlab.tokenizer import GPT4_PATTERN
    from gptlab.tokenizer.formats import byte_to_unicode

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(GPT4_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    start = time.perf_counter()
    tokenizer.train_from_iterator(documents, trainer=trainer)
    seconds = time.perf_counter() - start
    to_byte = {char: byte for byte, char in byte_to_unicode().items()}
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [merge.split(" ") if isinstance(merge, str) else merge for merge in merges]
    tokens = [bytes(to_byte[char] for char in left + right) for left, right in merges]
    return seconds, tokenizer.get_vocab_size(), tokens


def train_rustbpe(documents: list[str], vocab_size: int) -> tuple[float, int, list[bytes]]:
    import rustbpe

    from gptlab.tokenizer import GPT4_PATTERN

    tokenizer = rustbpe.Tokenizer()
    start = time.perf_counter()
    # rustbpe has no special tokens: one id fewer, so all three learn the same number of merges.
    tokenizer.train_from_iterator(documents, vocab_size=vocab_size - len(SPECIAL_TOKENS), pattern=GPT4_PATTERN)
    seconds = time.perf_counter() - start
    ranks = sorted(tokenizer.get_mergeable_ranks(), key=lambda item: item[1])
    return seconds, tokenizer.vocab_size, [token for token, rank in ranks if rank >= 256]


def run_child(trainer: str, corpus: str, vocab_size: int) -> None:
    """Train once and print one JSON line: seconds, peak and pre-train memory, vocab size, tokens."""
    _, documents = load_corpus(corpus)
    before_kib = own_peak_kib()
    if trainer == "gptlab-python":
        os.environ["GPTLAB_PURE_PYTHON"] = "1"
    train = {"gptlab": train_gptlab, "gptlab-python": train_gptlab, "hf-tokenizers": train_huggingface, "rustbpe": train_rustbpe}[
        trainer
    ]
    seconds, learned_vocab, tokens = train(documents, vocab_size)
    peak_kib = own_peak_kib() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    report = {
        "seconds": seconds,
        "peak_mib": peak_kib / 1024,
        "before_mib": before_kib / 1024,
        "vocab_size": learned_vocab,
        "tokens": [token.hex() for token in tokens],
    }
    print(json.dumps(report))


# ---------------------------------------------------------------- parent


def measure(trainer: str, corpus: str, vocab_size: int) -> dict:
    command = [sys.executable, __file__, "--child", trainer, corpus, str(vocab_size)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{trainer} on {corpus} -> {vocab_size} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def agreement(reference: list[str], other: list[str]) -> str:
    """How far two learned merge lists agree: identical leading ranks, and shared tokens."""
    same = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), min(len(reference), len(other)))
    shared = len(set(reference) & set(other)) / max(len(reference), 1)
    return f"first {same} of {len(reference)} merges identical, {shared:.1%} of tokens shared"


def run_case(corpus: str, vocab_size: int, repeats: int) -> None:
    label, _ = load_corpus(corpus)
    runs: dict[str, list[dict]] = {trainer: [] for trainer in TRAINERS}
    for _ in range(repeats):  # interleaved, so a noisy moment does not hit one trainer only
        for trainer in TRAINERS:
            runs[trainer].append(measure(trainer, corpus, vocab_size))
    reference = measure("gptlab-python", corpus, vocab_size)
    if reference["tokens"] != runs["gptlab"][-1]["tokens"]:
        raise AssertionError(f"{label} -> {vocab_size}: compiled and pure-Python gptlab learned different merges")
    best = {trainer: min(run["seconds"] for run in runs[trainer]) for trainer in TRAINERS}
    peak = {trainer: max(run["peak_mib"] for run in runs[trainer]) for trainer in TRAINERS}
    figures = "  ".join(f"{trainer} {best[trainer]:.2f} s ({peak[trainer]:.0f} MiB)" for trainer in TRAINERS)
    ratios = "  ".join(f"gptlab/{SHORT_NAMES[trainer]} {best['gptlab'] / best[trainer]:.2f}" for trainer in TRAINERS[1:])
    print(f"{label} -> {vocab_size}  {figures}  ratio {ratios}", flush=True)

    last = {trainer: runs[trainer][-1] for trainer in TRAINERS}
    before = "  ".join(f"{trainer} {last[trainer]['before_mib']:.0f} MiB" for trainer in TRAINERS)
    print(f"    memory before train (interpreter + corpus): {before}")
    print(
        f"    sanity: learned vocab size gptlab {last['gptlab']['vocab_size']} "
        f"(256 bytes + {len(last['gptlab']['tokens'])} merges + {len(SPECIAL_TOKENS)} special), "
        f"hf-tokenizers {last['hf-tokenizers']['vocab_size']}, "
        f"rustbpe {last['rustbpe']['vocab_size']} (asked for {vocab_size - len(SPECIAL_TOKENS)}: no special tokens)"
    )
    print(
        f"    gptlab pure-Python reference: {reference['seconds']:.2f} s ({reference['peak_mib']:.0f} MiB), "
        f"merges identical to the compiled trainer's: yes ({len(reference['tokens'])})"
    )
    for reference, other in [("gptlab", "hf-tokenizers"), ("gptlab", "rustbpe"), ("hf-tokenizers", "rustbpe")]:
        tokens = last[reference]["tokens"], last[other]["tokens"]
        print(f"    merges {reference} vs {other}: {agreement(*tokens)}")
    times = "  ".join(f"{trainer} " + "/".join(f"{run['seconds']:.2f}" for run in runs[trainer]) for trainer in TRAINERS)
    print(f"    all runs (s): {times}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per trainer and case; the best time is shown")
    parser.add_argument("--quick", action="store_true", help="only the small case and Shakespeare -> 4096")
    parser.add_argument("--large-mb", type=int, default=0, help="also a corpus of this many MB -> 32768, run once")
    parser.add_argument("--child", nargs=3, metavar=("TRAINER", "CORPUS", "VOCAB_SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        trainer, corpus, vocab_size = args.child
        run_child(trainer, corpus, int(vocab_size))
        return
    print(header("BPE training: gptlab vs Hugging Face tokenizers vs rustbpe", ["gptlab", "tokenizers", "rustbpe", "regex"]))
    print(
        f"# GPT-4 split pattern, special tokens {SPECIAL_TOKENS} (rustbpe: none, so vocab_size - 1); default threads/workers (all cores)."
    )
    print(f"# time: best of {args.repeats}, train call only, each run in a fresh process; memory: largest peak RSS of those runs.")
    print(f"# small case: the one Shakespeare work closest to {SMALL_TARGET_BYTES:,} bytes.")
    print("# memory: the child's peak RSS + its largest worker process's, if any (all three count on threads).")
    print("# ratio = gptlab seconds / other seconds (< 1: gptlab is faster). Merge lists differ where pair counts tie.")
    cases = CASES[:2] if args.quick else CASES
    for corpus, vocab_size in cases:
        run_case(corpus, vocab_size, args.repeats)
    if args.large_mb:
        run_case(f"mixed{args.large_mb}", 32768, 1)


if __name__ == "__main__":
    main()
