"""Shared-prefix, packed scoring (gptlab.eval.packing) against the one-request-per-row reference (gptlab.eval.scoring)."""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.eval import packing
from gptlab.eval.packing import plan_rows, plan_units, score_groups
from gptlab.eval.scoring import score_continuations
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError

VOCAB = 512  # the tiny presets' vocabulary
BF16_TOLERANCE = 0.02  # nats per request: bf16 rounds differently in a packed row than alone (measured: up to 0.002)
CONFIGS = {  # all block_size 64, fp32 (the presets' default dtype)
    "gpt2": lambda **changes: preset("gpt2-tiny", **changes),  # learned positions
    "llama": lambda **changes: preset("llama-tiny", **changes),  # rotary, grouped-query attention
    "llama-window-softcap": lambda **changes: preset("llama-tiny", attn_window=6, window_pattern="SL", logit_softcap=15.0, **changes),
}


def build(name: str, **changes) -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIGS[name](**changes)).float().eval()  # fp32 asked for, whatever the default dtype


MODELS = {name: build(name) for name in CONFIGS}  # read only: every test may share them


@pytest.fixture(params=list(CONFIGS))
def model(request):
    return MODELS[request.param]


def greedy_continuation(model: GPT, context: list[int], length: int) -> list[int]:
    """The model's own argmax continuation, so that some requests are greedy and the flag is tested both ways."""
    tokens = list(context)
    with torch.no_grad():
        for _ in range(length):
            logits, _ = model(torch.tensor([tokens[-model.config.block_size :]], device=next(model.parameters()).device))
            tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(context) :]


def assert_same_as_reference(model: GPT, groups, **options) -> None:
    """score_groups equals score_continuations group by group: logprob within 1e-4, greedy identical."""
    packed = score_groups(model, groups, **options)
    assert len(packed) == len(groups)
    for group, scores in zip(groups, packed):
        reference = score_continuations(model, group)
        assert [score.greedy for score in scores] == [score.greedy for score in reference]
        for score, expected in zip(scores, reference):
            assert score.logprob == pytest.approx(expected.logprob, abs=1e-4)


def random_ids(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(length)]


def multiple_choice_groups(model: GPT, rng: random.Random, n_groups: int, max_context: int = 30) -> list[list[tuple]]:
    """Groups of 2-4 choices after one context; the first choice is the model's greedy continuation."""
    groups = []
    for _ in range(n_groups):
        context = random_ids(rng, rng.randint(1, max_context))
        choices = [greedy_continuation(model, context, rng.randint(1, 3))]
        choices += [random_ids(rng, rng.randint(1, 6)) for _ in range(rng.randint(1, 3))]
        groups.append([(context, choice) for choice in choices])
    return groups


def test_score_groups_equals_reference_on_multiple_choice_groups(model):
    groups = multiple_choice_groups(model, random.Random(1), n_groups=12)
    flags = {score.greedy for group in groups for score in score_continuations(model, group)}
    assert flags == {True, False}  # both kinds of greedy flag are compared
    assert_same_as_reference(model, groups)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_score_groups_equals_reference_on_random_groups(data):
    """Random contexts and continuations of random lengths, over and under the context, sharing random prefixes."""
    model = MODELS[data.draw(st.sampled_from(list(MODELS)))]
    token = st.integers(0, VOCAB - 1)
    stem = data.draw(st.lists(token, min_size=1, max_size=40))
    groups = []
    for _ in range(data.draw(st.integers(1, 4))):
        group = []
        for _ in range(data.draw(st.integers(1, 4))):
            cut = data.draw(st.integers(1, len(stem)))  # requests share the stem's first `cut` tokens at least
            context = stem[:cut] + data.draw(st.lists(token, max_size=30))
            group.append((context, data.draw(st.lists(token, min_size=1, max_size=8))))
        groups.append(group)
    assert_same_as_reference(model, groups, batch_size=data.draw(st.integers(1, 4)))


def test_score_groups_equals_reference_when_choices_share_leading_tokens(model):
    """Choices that share their first tokens, a choice that is a prefix of another, identical choices, a group of one."""
    rng = random.Random(2)
    context = random_ids(rng, 20)
    head = greedy_continuation(model, context, 3)
    mixed = [(context, head), (context, head + [7, 8]), (context, head[:1]), (context, head[:2] + [9]), (context, head), (context, [5])]
    sharing = [(context, head), (context, head[:2] + [9]), (context, head + [4])]
    mixed_unit, sharing_unit = plan_units([mixed, sharing], model.config.block_size)
    assert len(mixed_unit.tokens) == 20 + 2 + 4 + 0 + 2 + 2 + 0  # the prefix is what all six inputs share: the context
    assert len(sharing_unit.tokens) == 22 + 0 + 0 + 1  # the prefix runs two tokens into every choice
    assert sharing_unit.reads[:2] == [[19, 20, 21], [19, 20, 21]]  # both read every logit inside the prefix
    assert_same_as_reference(model, [mixed, sharing, [(context, [3, 4])], [(context, head), (context, head)]])


def test_score_groups_equals_reference_on_winogrande_style_groups(model):
    """Two contexts that differ in one word, the same continuation: the prefix is the shared start of the contexts."""
    rng = random.Random(3)
    groups = []
    for _ in range(5):
        start, end, continuation = random_ids(rng, rng.randint(1, 12)), random_ids(rng, rng.randint(0, 6)), random_ids(rng, 5)
        groups.append([(start + [11] + end, continuation), (start + [12, 13] + end, continuation)])
    assert_same_as_reference(model, groups)


def test_score_groups_falls_back_to_requests_when_a_group_is_longer_than_the_context(model):
    rng = random.Random(4)
    block = model.config.block_size
    long_context = [(random_ids(rng, 2 * block), random_ids(rng, rng.randint(1, 5))) for _ in range(3)]  # cut on the left
    wide = [(random_ids(rng, 8), random_ids(rng, 20)) for _ in range(4)]  # each fits, but not all four in one row
    context = random_ids(rng, 50)
    shared_wide = [(context, random_ids(rng, 10)) for _ in range(3)]  # 50 + 3 x 9 > 64: unpacked too
    groups = [long_context, wide, shared_wide, [(random_ids(rng, 5), [1])]]
    units = plan_units(groups, block)
    assert len(units) == 3 + 4 + 3 + 1 and all(len(unit.keys) == 1 for unit in units)  # the first three split into requests
    assert all(len(unit.tokens) <= block for unit in units)
    assert_same_as_reference(model, groups)


def test_score_groups_equals_reference_when_groups_fill_many_rows(model):
    groups = multiple_choice_groups(model, random.Random(5), n_groups=30)
    rows = plan_rows(groups, model.config.block_size)
    assert len(rows) > 2  # several rows, and several batches below
    assert_same_as_reference(model, groups, batch_size=2)
    assert_same_as_reference(model, groups, batch_size=1)


def test_score_groups_scores_in_eval_mode_and_puts_a_training_model_back():
    model = build("gpt2", dropout=0.5).train()  # dropout would change the scores if it ran
    groups = [[([1, 2, 3], [4]), ([1, 2, 3], [5, 6])], [([9] * 10, [8, 7])]]
    packed = score_groups(model, groups)
    assert model.training
    assert_same_as_reference(model, groups)
    assert score_groups(model, groups) == packed


def test_score_groups_sends_only_scored_positions_through_the_output_layer():
    model = MODELS["gpt2"]
    seen = []
    handle = model.lm_head.register_forward_hook(lambda module, args, output: seen.append(output.shape[:-1]))
    try:
        score_groups(model, [[(list(range(1, 41)), [7, 8, 9]), (list(range(1, 41)), [5])]])
    finally:
        handle.remove()
    assert seen == [(1, 4)]  # 3 + 1 continuation tokens, not the 42 packed positions


def test_score_groups_equals_reference_when_the_head_is_not_narrowed(monkeypatch):
    """A compiled model may not call a hook added after compiling: the logits of every position are picked then."""
    from contextlib import contextmanager

    @contextmanager
    def no_hook(model, rows, columns):
        yield []

    monkeypatch.setattr(packing, "_head_only_at", no_hook)
    model = MODELS["llama"]
    assert_same_as_reference(model, multiple_choice_groups(model, random.Random(6), n_groups=6))


def test_plan_units_lays_out_the_module_docstring_example():
    (unit,) = plan_units([[([5, 9, 4], [2, 7]), ([5, 9, 4], [3])]], block_size=64)
    assert (unit.tokens, unit.positions, unit.branches) == ([5, 9, 4, 2], [0, 1, 2, 3], [0, 0, 0, 1])
    assert (unit.reads, unit.targets, unit.keys) == ([[2, 3], [2]], [[2, 7], [3]], [(0, 0), (0, 1)])


def test_plan_rows_computes_a_shared_context_once():
    rng = random.Random(7)
    context = random_ids(rng, 100)
    choices = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    group = [(context, choice) for choice in choices]
    rows = plan_rows([group], block_size=256)
    packed = sum(len(unit.tokens) for row in rows for unit in row)
    branches = sum(len(choice) - 1 for choice in choices)  # the last token of a choice is only a target
    assert packed == 100 + branches == 106
    assert packed < sum(100 + len(choice) - 1 for choice in choices) == 406


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 40), st.lists(st.integers(1, 10), min_size=1, max_size=4)), min_size=1, max_size=30),
    block_size=st.integers(16, 64),
)
def test_plan_rows_fills_rows_within_the_block_and_places_every_request_once(sizes, block_size):
    groups = [[([1] * context, [2] * length) for length in lengths] for context, lengths in sizes]
    rows = plan_rows(groups, block_size)
    assert all(sum(len(unit.tokens) for unit in row) <= block_size for row in rows)
    keys = sorted(key for row in rows for unit in row for key in unit.keys)
    assert keys == sorted((g, r) for g, group in enumerate(groups) for r in range(len(group)))


def test_score_groups_under_bf16_autocast_stays_near_the_reference():
    model = MODELS["llama"]
    groups = multiple_choice_groups(model, random.Random(8), n_groups=8)
    packed = score_groups(model, groups, autocast=torch.autocast("cpu", dtype=torch.bfloat16))
    reference = [score_continuations(model, group, autocast=torch.autocast("cpu", dtype=torch.bfloat16)) for group in groups]
    assert packed != score_groups(model, groups)  # autocast did apply: fp32 gives other numbers
    for scores, expected in zip(packed, reference):
        for score, want in zip(scores, expected):
            assert score.logprob == pytest.approx(want.logprob, abs=BF16_TOLERANCE)


def test_score_groups_rejects_bad_input_with_a_clear_error():
    model = MODELS["gpt2"]
    with pytest.raises(GptlabError, match="batch_size"):
        score_groups(model, [[([1], [2])]], batch_size=0)
    with pytest.raises(GptlabError, match="continuation is empty"):
        score_groups(model, [[([1], [])]])
    with pytest.raises(GptlabError, match="outside the vocabulary"):
        score_groups(model, [[([1], [VOCAB + 3])]])
    assert score_groups(model, []) == [] and score_groups(model, [[]]) == [[]]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_score_groups_equals_reference_on_cuda_with_bf16_autocast():
    model = build("llama").cuda()
    groups = multiple_choice_groups(model, random.Random(9), n_groups=20)
    assert_same_as_reference(model, groups)  # fp32 on the GPU
    bf16 = torch.autocast("cuda", dtype=torch.bfloat16)
    packed = score_groups(model, groups, autocast=bf16)
    reference = [score_continuations(model, group, autocast=torch.autocast("cuda", dtype=torch.bfloat16)) for group in groups]
    for scores, expected in zip(packed, reference):
        for score, want in zip(scores, expected):
            assert score.logprob == pytest.approx(want.logprob, abs=BF16_TOLERANCE)
