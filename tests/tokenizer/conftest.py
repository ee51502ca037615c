"""Reference tokenizers for the tokenizer tests: gptlab and tiktoken built from the same offline files."""

import pytest

SAMPLES = {
    "code": (
        "def f(x: int) -> list[int]:\n    return [i ** 2 for i in range(x) if i % 3 != 0]  # squares\n\n"
        "class A(B):\n\tpass\n\n\nif __name__ == '__main__':\n    print(f\"{f(10)!r:>20}\")\r\n"
        "const y = {a: 1, 'b': [true, null]}; /* c */ x+=1;;; x->y; a::b <=> c != d\n"
    ),
    "multilingual": (
        "Le cœur a ses raisons. Über die Brücke — ça coûte 12,50 €. Москва, столица России. "
        "Η Αθήνα. اللغة العربية ٤٠٠. 自然语言处理是人工智能的一个重要分支。吾輩は猫である。"
        "한국어는 한글로 표기하며. 🎉🎉 👩‍💻 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ☀️→🌧️ ∑ᵢ xᵢ² ≤ ∞ \U0001f600\U0010ffff"
    ),
    "whitespace": "a  b   c\t\td\n\n\ne \n \n  \r\n\r\n   x\u00a0\u3000y\u2003 \x0b\x0c end   \n\n   ",
    "contractions": "I'm you're he's we'll they'd I've can't DON'T It'S 's 't 're 've 'm 'll 'd '''' ’s",
    "numbers": "1 12 123 1234 12345 3.14159 1e10 0x1F 2024-11-23 ١٢٣ ½ ²",
    "empty": "",
}


@pytest.fixture(scope="session", params=["gpt2", "cl100k_base", "o200k_pattern"])
def pair(request):
    """(gptlab Tokenizer, tiktoken Encoding) read from the same offline files (see dev extras)."""
    fixture = {"gpt2": "gpt2_pair", "cl100k_base": "cl100k_pair", "o200k_pattern": "o200k_pattern_pair"}[request.param]
    return request.getfixturevalue(fixture)


@pytest.fixture(scope="session")
def gpt2_pair():
    from gptlab.tokenizer.pretrained import load_pretrained, tiktoken_reference

    return load_pretrained("gpt2"), tiktoken_reference("gpt2")


@pytest.fixture(scope="session")
def cl100k_pair():
    from gptlab.tokenizer.pretrained import load_pretrained, tiktoken_reference

    return load_pretrained("cl100k_base"), tiktoken_reference("cl100k_base")


@pytest.fixture(scope="session")
def o200k_pattern_pair(cl100k_pair):
    """cl100k_base's vocabulary split by the o200k pattern, in gptlab and in tiktoken.

    o200k_base's own rank file is not available offline; a 100K vocabulary whose merges cross
    the places where o200k splits differently from cl100k (case changes, "/" runs) tests the
    o200k scanner as well.
    """
    import tiktoken

    from gptlab.tokenizer import O200K_PATTERN, Tokenizer

    ours, theirs = cl100k_pair
    tokenizer = Tokenizer(ours.vocab, ours.merges, ours.special_tokens, O200K_PATTERN)
    encoding = tiktoken.Encoding(
        name="cl100k_o200k_pattern",
        pat_str=O200K_PATTERN,
        mergeable_ranks=theirs._mergeable_ranks,
        special_tokens=theirs._special_tokens,
    )
    return tokenizer, encoding


@pytest.fixture(scope="session")
def shakespeare_documents():
    from gptlab.data.corpus import shakespeare_documents

    return shakespeare_documents()


@pytest.fixture(scope="session")
def small_tokenizer():
    """A tokenizer trained on a little multilingual text, with two special tokens."""
    from gptlab.tokenizer import Tokenizer

    text = "\n".join(SAMPLES.values()) * 3
    return Tokenizer.train([text], vocab_size=400, special_tokens=["<|endoftext|>", "<|pad|>"])
