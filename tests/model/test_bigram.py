"""The bigram hash table (--model.bigram-vocab): its rows by brute force, and every decoding path (the KV cache,
left-padded batches, continuous batching with the prefix cache) equal to the model run on whole sequences."""

import pytest
import torch

from gptlab.export.gguf import gguf_problems
from gptlab.export.hf import check_exportable
from gptlab.infer import SamplingConfig, generate
from gptlab.infer.engine import Engine, EngineConfig
from gptlab.model import GPT, preset
from gptlab.model.accounting import param_counts
from gptlab.model.gpt import bigram_buckets
from gptlab.runtime import GptlabError

ROWS = 97
GREEDY = SamplingConfig(max_new_tokens=12, temperature=0)


def bigram_model(name: str = "llama-tiny", rows: int = ROWS) -> GPT:
    torch.manual_seed(0)
    model = GPT(preset(name, vocab_size=256, block_size=96, bigram_vocab=rows)).eval()
    with torch.no_grad():  # a trained table: zeros (its start) would hide a wrong row
        model.transformer["bigram"].weight.normal_(0, 0.5)
    return model


def test_a_new_table_adds_nothing_so_the_model_starts_as_the_plain_one():
    torch.manual_seed(0)
    plain = GPT(preset("llama-tiny", vocab_size=256, block_size=96)).eval()
    torch.manual_seed(0)
    hashed = GPT(preset("llama-tiny", vocab_size=256, block_size=96, bigram_vocab=ROWS)).eval()
    idx = torch.randint(0, 256, (2, 20))
    assert torch.equal(plain(idx)[0], hashed(idx)[0])


def test_the_rows_are_the_hash_of_each_pair_and_row_0_without_a_previous_token():
    idx = torch.tensor([[5, 6, 7, 5, 6]])
    before = torch.tensor([[-1, 5, 6, 7, 5]])
    expected = [[0] + [(p * 36313 + t * 27191) % (ROWS - 1) + 1 for p, t in zip([5, 6, 7, 5], [6, 7, 5, 6])]]
    assert bigram_buckets(before, idx, ROWS).tolist() == expected
    assert expected[0][1] == expected[0][4]  # the same pair, the same row


def test_the_forward_adds_each_pairs_row_to_the_token_embedding():
    """Against the plain model with the brute-force rows added to its token embeddings by a hook."""
    model = bigram_model()
    idx = torch.randint(0, 256, (2, 16))
    table = model.transformer["bigram"].weight
    rows = [[0] + [(int(p) * 36313 + int(t) * 27191) % (ROWS - 1) + 1 for p, t in zip(seq[:-1], seq[1:])] for seq in idx]
    plain = GPT(preset("llama-tiny", vocab_size=256, block_size=96)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "bigram" not in k})
    plain.transformer["wte"].register_forward_hook(lambda module, args, out: out + table[torch.tensor(rows)])
    with torch.no_grad():
        assert torch.allclose(model(idx)[0], plain(idx)[0], atol=1e-5)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_cached_decoding_equals_greedy_over_whole_sequences(name):
    model = bigram_model(name)
    prompt = torch.randint(0, 256, (9,)).tolist()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(GREEDY.max_new_tokens):
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    assert generate(model, [prompt], GREEDY)[0] == ids[len(prompt):]


def test_a_left_padded_batch_equals_each_prompt_alone():
    model = bigram_model()
    prompts = [torch.randint(0, 256, (n,)).tolist() for n in (3, 11, 7)]
    together = generate(model, prompts, GREEDY)
    assert together == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]


def test_continuous_batching_with_the_prefix_cache_equals_each_prompt_alone():
    """The second and third requests restore the shared 32-token prefix from the prefix cache: the first new
    token's predecessor is the restored prefix's last one."""
    model = bigram_model()
    shared = torch.randint(0, 256, (32,)).tolist()
    prompts = [shared + [1, 2, 3], shared + [4, 5], shared + [6]]
    with Engine(model, EngineConfig(slots=2, prefix_cache_mb=8)) as engine:
        outputs = [list(engine.submit(prompt, GREEDY)) for prompt in prompts]
        assert engine.prefix_cache.stats.hits > 0
    assert outputs == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]


def test_parameters_count_the_table_as_an_embedding():
    model = bigram_model()
    counts = param_counts(model.config)
    assert counts["total"] == model.num_params() and counts["bigram"] == ROWS * model.config.n_embd
    assert counts["non_embedding"] == model.num_params(embeddings=False)


def test_exports_refuse_the_table_naming_the_flag():
    config = bigram_model().config
    with pytest.raises(GptlabError, match="bigram_vocab=97"):
        check_exportable(config)
    assert "--model.bigram-vocab 97" in gguf_problems(config)


@pytest.mark.parametrize("rows", [1, -3])
def test_a_table_of_fewer_than_two_rows_is_refused(rows):
    with pytest.raises(GptlabError, match="bigram_vocab must be 0"):
        preset("llama-tiny", bigram_vocab=rows)
