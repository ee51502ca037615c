"""Log-likelihood scoring and multiple-choice tasks, checked against plain per-example forward passes.

Scoring is compared with transformers itself on the same weights; HellaSwag
accuracy with a hand computation, one unbatched forward pass per ending.
"""

import json
import urllib.error
import urllib.request

import pytest
import torch
import torch.nn.functional as F
import transformers  # a dev extra: make test installs it

from gptlab.eval.scoring import count_truncated, rolling_loglikelihood, rolling_requests, score_continuations
from gptlab.eval.tasks import Example, HellaSwag, MultipleChoiceTask, hellaswag
from gptlab.model import GPT, ModelConfig
from gptlab.model.hf import load_hf_gpt2
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

BLOCK = 16
ATOL = 1e-4


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Random weights well away from init, so log-probabilities differ clearly between tokens."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(transformers GPT2LMHeadModel, the same weights loaded into gptlab's GPT)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=BLOCK, vocab_size=97, bos_token_id=0, eos_token_id=0)
    reference = transformers.GPT2LMHeadModel(config).eval()
    perturb(reference, seed=1)
    directory = tmp_path_factory.mktemp("hf_gpt2")
    reference.save_pretrained(directory)
    return reference, load_hf_gpt2(directory).eval()


def reference_score(reference, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """Summed log p of the continuation with transformers, one unpadded row; contexts cut on the left to fit."""
    tokens = (context + continuation)[-(BLOCK + 1) :]
    with torch.no_grad():
        logits = reference(torch.tensor([tokens[:-1]])).logits[0]
    logprobs = F.log_softmax(logits.double(), dim=-1)
    positions = range(len(tokens) - 1 - len(continuation), len(tokens) - 1)
    total = sum(logprobs[p, tokens[p + 1]].item() for p in positions)
    greedy = all(logits[p].argmax().item() == tokens[p + 1] for p in positions)
    return total, greedy


def greedy_continuation(reference, context: list[int], n: int) -> list[int]:
    tokens = list(context)
    with torch.no_grad():
        for _ in range(n):
            tokens.append(int(reference(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(context) :]


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---------------------------------------------------------------- scoring


def test_score_continuations_matches_transformers_on_ragged_batches(models):
    reference, model = models
    requests = [(random_ids(n_context, seed), random_ids(n_continuation, seed + 100))
                for seed, (n_context, n_continuation) in enumerate([(1, 1), (5, 3), (12, 4), (3, 9), (7, 1), (2, 2), (9, 6)])]
    greedy_context = random_ids(4, seed=50)
    requests.append((greedy_context, greedy_continuation(reference, greedy_context, 3)))
    scores = score_continuations(model, requests, batch_size=3)
    assert len(scores) == len(requests)
    for (context, continuation), score in zip(requests, scores):
        expected, greedy = reference_score(reference, context, continuation)
        assert score.logprob == pytest.approx(expected, abs=ATOL)
        assert score.greedy == greedy
    assert scores[-1].greedy and not all(score.greedy for score in scores)


def test_score_continuations_cuts_long_contexts_on_the_left_and_counts_them(models):
    reference, model = models
    sizes = [(30, 4), (13, 5), (12, 5), (5, 2)]  # inputs needed: 33 and 17 are too many, 16 and 6 fit exactly or well
    requests = [(random_ids(n_context, seed), random_ids(n_continuation, seed + 10)) for seed, (n_context, n_continuation) in enumerate(sizes)]
    assert count_truncated(requests, BLOCK) == 2
    for (context, continuation), score in zip(requests, score_continuations(model, requests, batch_size=2)):
        assert score.logprob == pytest.approx(reference_score(reference, context, continuation)[0], abs=ATOL)


def test_score_continuations_refuses_what_cannot_be_scored(models):
    _, model = models
    with pytest.raises(GptlabError, match="continuation of 17 tokens does not fit"):
        score_continuations(model, [([1], random_ids(17, 0))])
    with pytest.raises(GptlabError, match="context is empty"):
        score_continuations(model, [([], [1, 2])])
    with pytest.raises(GptlabError, match="token id 500 is outside the vocabulary"):
        score_continuations(model, [([1], [500])])


def test_rolling_requests_cut_a_document_into_disjoint_windows():
    assert rolling_requests([10, 11, 12, 13, 14], 3, prefix_token=0) == [([0], [10, 11, 12]), ([11, 12], [13, 14])]
    assert rolling_requests([10, 11, 12], 3, prefix_token=0, stride=2) == [([0], [10, 11]), ([0, 10, 11], [12])]


def test_rolling_loglikelihood_with_stride_1_gives_every_token_a_full_context(models):
    reference, model = models
    ids = random_ids(40, seed=7)
    tokens = [0, *ids]
    expected = 0.0
    with torch.no_grad():
        for i in range(1, len(tokens)):  # token i given the BLOCK tokens before it (fewer at the start)
            window = tokens[max(0, i - BLOCK) : i]
            expected += F.log_softmax(reference(torch.tensor([window])).logits[0, -1].double(), -1)[tokens[i]].item()
    assert rolling_loglikelihood(model, ids, prefix_token=0, stride=1, batch_size=8) == pytest.approx(expected, abs=1e-3)
    short = ids[:BLOCK]  # one window: the whole document after the prefix, as a single forward pass
    with torch.no_grad():
        logprobs = F.log_softmax(reference(torch.tensor([[0, *short[:-1]]])).logits[0].double(), -1)
    whole = sum(logprobs[p, token].item() for p, token in enumerate(short))
    assert rolling_loglikelihood(model, short, prefix_token=0) == pytest.approx(whole, abs=ATOL)


# ---------------------------------------------------------------- HellaSwag

HELLASWAG_RECORDS = [
    ("A man sits on a roof. he", ["starts to pull up roofing.", "is ice fishing.", "eats a sandwich.", "sings loudly."], 0),
    ("A woman pours water into a glass. She", ["drinks it.", "throws it away.", "paints a fence.", "runs outside."], 0),
    ("The kids play in the snow. they", ["build a snowman.", "go swimming.", "read a book.", "bake a cake."], 2),
    ("A dog runs across the yard. it", ["catches the ball.", "sleeps.", "barks at a cat.", "jumps the fence."], 3),
    ("Two people are dancing on a stage while a crowd watches them closely and claps along to the music. They",
     ["bow.", "keep dancing faster and faster.", "leave.", "fall down."], 1),
    ("A chef chops onions. he", ["cries.", "adds them to a pan.", "washes the knife.", "smiles."], 1),
]


def write_hellaswag(path, records=HELLASWAG_RECORDS):
    """The official jsonl layout, including the fields we do not use."""
    lines = []
    for index, (context, endings, label) in enumerate(records):
        ctx_a, _, ctx_b = context.rpartition(". ")
        lines.append(json.dumps({
            "ind": index, "activity_label": "Fixture", "ctx_a": ctx_a + ".", "ctx_b": ctx_b, "ctx": context,
            "endings": endings, "source_id": f"fixture~{index}", "split": "val", "split_type": "indomain", "label": label,
        }))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def byte_tokenizer():
    return Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<|endoftext|>"])


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=257, block_size=64, n_layer=2, n_head=2, n_embd=32)).eval()
    perturb(model, seed=3)
    return model


def hand_accuracy(model, encode, records) -> tuple[float, float, int]:
    """acc, acc_norm and truncated rows, one plain forward pass per ending."""
    block = model.config.block_size
    right = right_norm = truncated = 0
    for context, endings, label in records:
        sums, means = [], []
        for ending in endings:
            context_ids, ending_ids = encode(context), encode(" " + ending)
            tokens = context_ids + ending_ids
            truncated += len(tokens) - 1 > block
            tokens = tokens[-(block + 1) :]
            with torch.no_grad():
                logits, _ = model(torch.tensor([tokens[:-1]]))
            logprobs = F.log_softmax(logits[0].double(), dim=-1)
            first = len(tokens) - 1 - len(ending_ids)
            total = sum(logprobs[p, tokens[p + 1]].item() for p in range(first, len(tokens) - 1))
            sums.append(total)
            means.append(total / len(ending_ids))
        right += max(range(len(sums)), key=sums.__getitem__) == label
        right_norm += max(range(len(means)), key=means.__getitem__) == label
    return right / len(records), right_norm / len(records), truncated


def test_hellaswag_accuracy_equals_a_hand_computation(tmp_path, tiny_model, byte_tokenizer):
    path = write_hellaswag(tmp_path / "hellaswag_val.jsonl")
    encode = byte_tokenizer.encode_ordinary
    result = HellaSwag(path).evaluate(tiny_model, encode, batch_size=5)
    acc, acc_norm, truncated = hand_accuracy(tiny_model, encode, HELLASWAG_RECORDS)
    assert result["n"] == 6 and result["truncated"] == truncated == 4  # the long scene overflows 64 tokens
    assert result["acc"] == pytest.approx(acc) and result["acc_norm"] == pytest.approx(acc_norm)
    assert result["examples_per_second"] > 0
    limited = HellaSwag(path).evaluate(tiny_model, encode, batch_size=64, limit=3)
    assert limited["n"] == 3
    assert limited["acc_norm"] == pytest.approx(hand_accuracy(tiny_model, encode, HELLASWAG_RECORDS[:3])[1])


def test_hellaswag_reads_the_official_fields(tmp_path):
    path = write_hellaswag(tmp_path / "val.jsonl")
    first = next(iter(HellaSwag(path).examples()))
    assert first == Example("A man sits on a roof. he", [" starts to pull up roofing.", " is ice fishing.", " eats a sandwich.", " sings loudly."], 0)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"ctx": "a", "endings": ["b", "c"], "label": 0', "not valid JSON"),
        ('{"ctx": "a", "endings": ["b", "c"]}', "missing field(s) label"),
        ('{"ctx": "a", "endings": ["b", "c"], "label": 5}', "label 5 is not an index"),
        ('{"ctx": "a", "endings": "bc", "label": 0}', "endings must be a non-empty list"),
    ],
)
def test_hellaswag_malformed_line_raises_with_its_line_number(tmp_path, line, message):
    path = write_hellaswag(tmp_path / "bad.jsonl", HELLASWAG_RECORDS[:2])
    path.write_text(path.read_text() + "\n" + line + "\n")  # a blank line 3 is skipped, line 4 is bad
    with pytest.raises(GptlabError, match=rf"bad\.jsonl:4: .*{message.replace('(', '.').replace(')', '.')}"):
        list(HellaSwag(path).examples())


def test_hellaswag_offline_without_a_copy_says_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    expected = tmp_path / "cache" / "hellaswag" / "hellaswag_val.jsonl"
    with pytest.raises(GptlabError, match="could not download HellaSwag") as error:
        list(HellaSwag().examples())
    assert str(expected) in str(error.value) and "--hellaswag-path" in str(error.value)
    assert not expected.exists()


def test_hellaswag_download_writes_the_cache_only_when_every_line_parses(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))
    good = write_hellaswag(tmp_path / "good.jsonl").read_bytes()
    served = []

    class Response:
        def __init__(self, data):
            self.data = data

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return self.data

    def fake_urlopen(url, timeout):
        served.append(url)
        return Response(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    cached = tmp_path / "cache" / "hellaswag" / "hellaswag_val.jsonl"
    payload = good[: len(good) // 2]  # cut mid-line, as a dropped connection would
    with pytest.raises(GptlabError, match=r"hellaswag_val\.jsonl:\d+: not valid JSON"):
        list(HellaSwag().examples())
    assert not cached.exists()
    payload = good
    assert len(list(HellaSwag().examples())) == 6 and cached.read_bytes() == good
    assert len(list(HellaSwag().examples())) == 6 and served == [hellaswag.URL] * 2  # the second read is the cache's


# ---------------------------------------------------------------- a new task is a few lines


class Arithmetic(MultipleChoiceTask):
    name = "arithmetic"

    def examples(self):
        yield Example([1, 2, 3], [[4], [9, 9]], gold=0)
        yield Example([5, 6], [[7, 8], [1], [2]], gold=2)


class Words(MultipleChoiceTask):
    def examples(self):
        yield Example("a", ["b", "c"], gold=0)


def test_multiple_choice_task_takes_ids_and_needs_encode_only_for_text(tiny_model):
    result = Arithmetic().evaluate(tiny_model, batch_size=2)
    assert result["n"] == 2 and result["truncated"] == 0 and 0 <= result["acc"] <= 1
    with pytest.raises(GptlabError, match="pass an encode function"):
        Words().evaluate(tiny_model)
    with pytest.raises(GptlabError, match="gold index 3"):
        Example("a", ["b", "c"], 3)
