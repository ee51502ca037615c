"""Prefix caching: every request's tokens equal those of the same engine without the cache, and of `generate` alone."""

import pytest
import torch

import gptlab.infer.prefix_cache as prefix_cache_module
from gptlab.infer import SamplingConfig, generate
from gptlab.infer.engine import Engine, EngineConfig, SlotCache
from gptlab.infer.prefix_cache import BLOCK_TOKENS, PrefixCache
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError

GREEDY = SamplingConfig(max_new_tokens=12, temperature=0)
OFF = 0


def tiny_model(name: str = "gpt2-tiny", **overrides) -> GPT:
    torch.manual_seed(0)
    model = GPT(preset(name, vocab_size=512, block_size=128, **overrides)).float().eval()  # fp32 asked for explicitly
    with torch.no_grad():  # weights 5x their init: sharper attention, so a wrong cached key or value changes the tokens
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(5)
    return model


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def block_bytes(model: GPT) -> int:
    """Bytes of one stored block: keys and values of every layer for BLOCK_TOKENS tokens, float32."""
    config = model.config
    return 2 * config.n_layer * config.kv_heads * BLOCK_TOKENS * config.head_dim * 4


def one_by_one(model: GPT, prompts, configs, prefix_cache_mb: float, on_step=None):
    """Each prompt submitted once the previous one has finished (and its slot's keys overwritten with noise):
    (outputs, cached tokens per request, engine stats)."""
    outputs, cached = [], []
    with Engine(model, EngineConfig(slots=2, prefix_cache_mb=prefix_cache_mb), on_step=on_step) as engine:
        for prompt, config in zip(prompts, configs):
            request = engine.submit(prompt, config)
            outputs.append(list(request))
            cached.append(request.cached_tokens)
            assert engine.wait_idle(60)
            engine.cache.keys.normal_(), engine.cache.values.normal_()  # no request may lean on keys a slot kept from before
        stats = engine.prefix_cache.stats if engine.prefix_cache is not None else None
    return outputs, cached, stats


def shared_system_prompt(count: int, system: int = 40) -> list[list[int]]:
    """A 40-token system prompt (2 full blocks and 8 more) and distinct questions of 1 to 20 tokens."""
    head = random_ids(system, seed=7)
    return [head + random_ids(1 + 3 * i, seed=100 + i) for i in range(count)]


@pytest.mark.parametrize("name, overrides", [("gpt2-tiny", {}), ("llama-tiny", {}), ("moe-tiny", {}),
                                             ("llama-tiny", {"attn_window": 6, "window_pattern": "S"})])
def test_prefix_cache_greedy_shared_system_prompt_equals_engine_without_cache_and_generate(name, overrides):
    model = tiny_model(name, **overrides)
    prompts = shared_system_prompt(6)
    cached_outputs, cached, stats = one_by_one(model, prompts, [GREEDY] * 6, prefix_cache_mb=1)
    plain_outputs, _, _ = one_by_one(model, prompts, [GREEDY] * 6, prefix_cache_mb=OFF)
    assert cached_outputs == plain_outputs == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]
    assert cached == [0, 32, 32, 32, 32, 32]  # the system prompt's two full blocks, from the second request on
    assert stats.hits == 5 * 32 and stats.misses == sum(map(len, prompts)) - 5 * 32


def test_prefix_cache_seeded_sampling_equals_engine_without_cache_and_generate():
    model = tiny_model()
    prompts = shared_system_prompt(5)
    configs = [SamplingConfig(max_new_tokens=12, temperature=0.9, top_k=50, top_p=0.95, seed=seed) for seed in range(5)]
    cached_outputs, cached, _ = one_by_one(model, prompts, configs, prefix_cache_mb=1)
    plain_outputs, _, _ = one_by_one(model, prompts, configs, prefix_cache_mb=OFF)
    assert cached_outputs == plain_outputs == [generate(model, [p], c)[0] for p, c in zip(prompts, configs)]
    assert cached[1:] == [32] * 4


def test_prefix_cache_second_turn_reuses_the_first_turns_prompt_and_reply():
    model = tiny_model()
    config = SamplingConfig(max_new_tokens=20, temperature=0)  # no stop token: every reply runs to 20 tokens
    first = random_ids(30, seed=3)
    with Engine(model, EngineConfig(slots=2, prefix_cache_mb=1)) as engine:
        reply = list(engine.submit(first, config))
        assert engine.wait_idle(60)
        engine.cache.keys.normal_(), engine.cache.values.normal_()  # only the prefix cache remembers the first turn
        second = first + reply + random_ids(9, seed=4)  # the next turn: the conversation so far, then new text
        request = engine.submit(second, config)
        answer = list(request)
    assert answer == generate(model, [second], config)[0]
    fed = len(first) + len(reply) - 1  # keys the first request cached: its prompt and every reply token but the last
    assert request.cached_tokens == fed // BLOCK_TOKENS * BLOCK_TOKENS == 48  # 3 blocks, 2 of them reached only by the reply


@pytest.mark.parametrize("length, reused", [(5, 0), (15, 0), (16, 0), (17, 16), (31, 16), (32, 16), (33, 32), (48, 32)])
def test_prefix_cache_reuses_full_blocks_only_and_always_computes_the_last_prompt_token(length, reused):
    """Shorter than a block: nothing to reuse; a multiple of the block size: its last block is recomputed, since the
    first new token's logits must come from a forward pass over the prompt's last token."""
    model = tiny_model()
    prompt = random_ids(length, seed=length)
    outputs, cached, _ = one_by_one(model, [prompt, prompt], [GREEDY, GREEDY], prefix_cache_mb=1)
    assert cached == [0, reused]
    assert outputs == [generate(model, [prompt], GREEDY)[0]] * 2


def test_prefix_cache_eviction_under_a_tiny_budget_keeps_outputs_and_bytes_within_budget():
    model = tiny_model()
    budget = 5 * block_bytes(model)  # 5 blocks: fewer than the 10 these prompts and replies fill
    heads = [random_ids(34, seed=20 + i) for i in range(3)]  # 2 full blocks each; a request keeps 3 (prompt and reply)
    order = [0, 0, 1, 0, 2, 2, 1, 0, 0]
    prompts = [heads[head] + random_ids(4, seed=40 + i) for i, head in enumerate(order)]
    seen = []

    def watch(engine: Engine) -> None:
        seen.append(engine.prefix_cache.stats.bytes)

    outputs, cached, stats = one_by_one(model, prompts, [GREEDY] * 9, prefix_cache_mb=budget / 2**20, on_step=watch)
    assert outputs == one_by_one(model, prompts, [GREEDY] * 9, prefix_cache_mb=OFF)[0]
    assert outputs == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]
    assert stats.evictions > 0 and stats.hits > 0 and max(seen) <= budget and stats.bytes <= budget
    assert stats.bytes == stats.blocks * block_bytes(model)


def test_prefix_cache_concurrent_requests_sharing_a_prefix_reuse_it_in_one_batch():
    model = tiny_model("llama-tiny")
    prompts = shared_system_prompt(4)
    with Engine(model, EngineConfig(slots=4, prefix_cache_mb=1)) as engine:
        requests = [engine.submit(prompt, GREEDY) for prompt in prompts]  # all waiting before the engine admits them
        outputs = [list(request) for request in requests]
        cached = [request.cached_tokens for request in requests]
        peak = engine.stats.peak_running
    assert outputs == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]
    assert sum(cached) >= 32 and peak >= 2  # later admissions reused the first one's blocks while it still ran


def test_prefix_cache_with_a_draft_model_equals_speculative_decoding_without_cache():
    model = tiny_model()
    torch.manual_seed(1)
    draft = GPT(preset("gpt2-tiny", vocab_size=512, block_size=128, n_layer=1)).float().eval()
    prompts = shared_system_prompt(4)
    outputs = {}
    for budget in (1, OFF):
        with Engine(model, EngineConfig(slots=2, prefix_cache_mb=budget, draft_tokens=3), draft=draft) as engine:
            outputs[budget] = []
            for prompt in prompts:
                outputs[budget].append(list(engine.submit(prompt, GREEDY)))
                assert engine.wait_idle(60)
                engine.cache.keys.normal_(), engine.cache.values.normal_()
            hits = engine.prefix_cache.stats.hits if engine.prefix_cache else 0
        assert hits == (3 * 32 if budget else 0)
    assert outputs[1] == outputs[OFF] == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]


def test_prefix_cache_restored_prefix_gives_the_logits_of_a_full_prefill():
    """The reference: one forward over the whole prompt. Cached: blocks copied from row 0 into row 1, then the rest."""
    model = tiny_model("llama-tiny")
    prompt = random_ids(40, seed=5)
    cache, store = SlotCache(model, 2), PrefixCache(1 << 20)
    idx = torch.tensor([prompt])
    with torch.inference_mode():
        cache.select([0], [0], len(prompt))
        full, _ = model(idx, cache=cache, last_only=True)
        store.store(cache.keys, cache.values, 0, prompt)
        cached = store.restore(cache.keys, cache.values, 1, prompt)
        cache.select([1], [cached], len(prompt) - cached)
        rest, _ = model(idx[:, cached:], cache=cache, last_only=True)
    assert cached == 32
    torch.testing.assert_close(rest, full, rtol=1e-5, atol=1e-5)


def test_prefix_cache_hash_collision_is_a_miss_not_a_wrong_prefix(monkeypatch):
    """Every block hashing alike: a prompt whose first block differs from the held one must not reuse it."""
    monkeypatch.setattr(prefix_cache_module, "hash", lambda value: 0, raising=False)
    model = tiny_model()
    prompts = [random_ids(40, seed=1), random_ids(40, seed=2), random_ids(40, seed=1)]
    outputs, cached, stats = one_by_one(model, prompts, [GREEDY] * 3, prefix_cache_mb=1)
    assert outputs == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]
    assert cached == [0, 0, 16] and stats.blocks == 1  # one key: only the first prompt's first block is held


def test_prefix_cache_evicts_leaves_first_so_every_held_block_stays_reachable():
    keys = torch.zeros(1, 1, 1, 64, 1)  # (n_layer, slots, n_kv_head, S, head_dim): a block is 2 * 16 floats = 128 bytes
    store = PrefixCache(4 * 128)
    long, other = list(range(64)), [1000 + i for i in range(32)]
    store.store(keys, keys, 0, long)  # 4 blocks: the budget
    store.store(keys, keys, 0, other)  # 2 more: two of the long chain's go, its last ones (leaves) first
    assert store.stats.evictions == 2 and store.stats.bytes == 4 * 128
    held = store._blocks
    assert all(block.parent is None or block.parent in held for block in held.values())
    assert store.restore(keys, keys, 0, long + [0]) == 32  # its first two blocks are still found
    assert store.restore(keys, keys, 0, other + [0]) == 32


def test_prefix_cache_a_block_over_the_budget_is_not_stored():
    keys = torch.zeros(1, 1, 1, 64, 1)
    store = PrefixCache(100)  # less than one 128-byte block
    store.store(keys, keys, 0, list(range(40)))
    assert store.stats.blocks == 0 and store.stats.bytes == 0 and store.restore(keys, keys, 0, list(range(40))) == 0


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), "64", True])
def test_engine_config_refuses_a_bad_prefix_cache_budget(value):
    with pytest.raises(GptlabError, match="prefix_cache_mb"):
        EngineConfig(prefix_cache_mb=value)


def test_engine_prefix_cache_is_off_with_zero_budget():
    with Engine(tiny_model(), EngineConfig(slots=1, prefix_cache_mb=0)) as engine:
        prompt = random_ids(40, seed=9)
        requests = [engine.submit(prompt, GREEDY) for _ in range(2)]
        [list(request) for request in requests]
        assert engine.prefix_cache is None and [request.cached_tokens for request in requests] == [0, 0]


def test_prefix_cache_clear_forgets_every_block_but_keeps_the_counts():
    keys = torch.zeros(1, 1, 1, 64, 1)
    store = PrefixCache(1 << 20)
    store.store(keys, keys, 0, list(range(48)))
    assert store.restore(keys, keys, 0, list(range(48))) == 32
    store.clear()
    assert store.restore(keys, keys, 0, list(range(48))) == 0
    assert (store.stats.blocks, store.stats.bytes, store.stats.hits, store.stats.misses) == (0, 0, 32, 16 + 48)
