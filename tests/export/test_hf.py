"""Every model gptlab makes leaves as a Hugging Face folder that transformers runs with gptlab's logits and greedy ids:
through transformers' own class where one computes it, else through the modeling code shipped in the folder."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers  # a dev extra: make test installs it

from gptlab.chat import END, ChatFormat, add_chat_tokens
from gptlab.cli.main import main
from gptlab.export import CUSTOM_CODE_FILES, export_hf
from gptlab.export import hf as export_module
from gptlab.infer import SamplingConfig, generate
from gptlab.model import GPT, preset
from gptlab.model.hf import load_pretrained_directory, read_pretrained_config
from gptlab.model.io import save_model
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer
from gptlab.train.config import shakespeare_cpu

pytestmark = pytest.mark.usefixtures("hf_modules_cache")  # transformers' copy of remote code under tmp (tests/conftest.py)

ATOL = 1e-5
CUSTOM = "GptlabForCausalLM"
TINY = {"vocab_size": 512, "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64}
RECIPE = dataclasses.replace(shakespeare_cpu().model, **TINY)  # the default recipe's switches (`gptlab run`), tiny
EVERYTHING = {"n_kv_head": 1, "logit_softcap": 1.5, "attn_window": 8, "window_pattern": "SL", "mlp_hidden": 40,
              "rope_theta": 500.0, "norm_eps": 1e-6, "bias": False}

CASES = {  # id: (preset or config, overrides, the class transformers loads)
    "gpt2": ("gpt2-tiny", {}, "GPT2LMHeadModel"),
    "gpt2-relu2": ("gpt2-tiny", {"activation": "relu2"}, "GPT2LMHeadModel"),
    "gpt2-untied-no-bias": ("gpt2-tiny", {"tie_embeddings": False, "bias": False}, "GPT2LMHeadModel"),
    "gpt2-mlp-hidden-zero-init": ("gpt2-tiny", {"mlp_hidden": 48, "zero_init": True}, "GPT2LMHeadModel"),
    "gpt2-rotary": ("gpt2-tiny", {"position": "rotary"}, CUSTOM),
    "gpt2-rms": ("gpt2-tiny", {"norm": "rms"}, CUSTOM),
    "gpt2-swiglu": ("gpt2-tiny", {"activation": "swiglu"}, CUSTOM),
    "gpt2-qk-norm": ("gpt2-tiny", {"qk_norm": True}, CUSTOM),
    "gpt2-gqa": ("gpt2-tiny", {"n_kv_head": 1}, CUSTOM),
    "gpt2-softcap": ("gpt2-tiny", {"logit_softcap": 1.5}, CUSTOM),
    "gpt2-window": ("gpt2-tiny", {"attn_window": 8, "window_pattern": "SL"}, CUSTOM),
    "llama": ("llama-tiny", {"rope_theta": 500000.0}, "LlamaForCausalLM"),
    "llama-qk-norm": ("llama-tiny", {"qk_norm": True}, "Qwen3ForCausalLM"),
    "llama-qk-norm-bias": ("llama-tiny", {"qk_norm": True, "bias": True}, CUSTOM),
    "llama-learned": ("llama-tiny", {"position": "learned"}, CUSTOM),
    "llama-layer-norm": ("llama-tiny", {"norm": "layer", "bias": True}, CUSTOM),
    "llama-gelu": ("llama-tiny", {"activation": "gelu"}, CUSTOM),
    "llama-relu2": ("llama-tiny", {"activation": "relu2"}, CUSTOM),
    "llama-softcap-tied": ("llama-tiny", {"logit_softcap": 1.5, "tie_embeddings": True}, CUSTOM),
    "llama-window": ("llama-tiny", {"n_layer": 3, "attn_window": 8, "window_pattern": "S"}, CUSTOM),
    "recipe": (RECIPE, {}, CUSTOM),
    "recipe-everything": (RECIPE, EVERYTHING, CUSTOM),
}


def ours(name_or_config, seed: int = 0, **overrides) -> GPT:
    """A random model, every parameter perturbed, so a dropped or swapped weight or norm shows in the logits."""
    config = preset(name_or_config, **overrides) if isinstance(name_or_config, str) else dataclasses.replace(name_or_config, **overrides)
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def load(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' generate on left-padded prompts (its KV cache), the new ids of each row."""
    T = max(map(len, prompts))
    ids = torch.tensor([[0] * (T - len(prompt)) + prompt for prompt in prompts])
    mask = torch.tensor([[0] * (T - len(prompt)) + [1] * len(prompt) for prompt in prompts])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return out[:, T:].tolist()


@pytest.mark.parametrize("case", CASES.keys())
def test_export_hf_gives_transformers_gptlabs_logits_and_greedy_ids(tmp_path, case):
    name, overrides, architecture = CASES[case]
    model = ours(name, **overrides)
    written = export_hf(model, tmp_path / "hf")
    assert (written.architecture, written.remote_code) == (architecture, architecture == CUSTOM)
    assert all((tmp_path / "hf" / name).is_file() == written.remote_code for name in CUSTOM_CODE_FILES)
    theirs = load(tmp_path / "hf")
    assert type(theirs).__name__ == architecture
    idx = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, _ = model(idx)
        logits = theirs(idx).logits
    assert expected.std() > 0.1  # not a degenerate model that any code matches
    torch.testing.assert_close(logits, expected, rtol=0, atol=ATOL)
    prompts = [[5, 9, 2, 7, 300, 11], [42, 17]]  # the second left-padded: positions and masks per row
    greedy = SamplingConfig(max_new_tokens=12, temperature=0)  # 6 + 12 positions: past the 8-key window
    assert hf_greedy(theirs, prompts, 12) == generate(model, prompts, greedy)


def test_export_hf_custom_folder_reads_back_into_gptlab_as_the_same_model(tmp_path):
    model = ours(RECIPE, **EVERYTHING, dropout=0.1)
    export_hf(model, tmp_path / "hf")
    assert read_pretrained_config(tmp_path / "hf") == model.config
    loaded = load_pretrained_directory(tmp_path / "hf")
    assert loaded.config == model.config
    for name, tensor in model.state_dict().items():
        rows = model.config.vocab_size  # the pad rows are not exported
        assert torch.equal(loaded.state_dict()[name][:rows], tensor[:rows]), name
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_gptlab.GptlabConfig",
                                  "AutoModelForCausalLM": "modeling_gptlab.GptlabForCausalLM"}


def test_export_hf_custom_folder_runs_where_gptlab_cannot_be_imported(tmp_path):
    """The user's machine need not have gptlab: a fresh Python with gptlab blocked loads the folder, same logits."""
    model = ours(RECIPE)
    export_hf(model, tmp_path / "hf")
    idx = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(3))
    code = ("import sys, torch; sys.modules['gptlab'] = None\n"  # `import gptlab` now raises ImportError
            "from transformers import AutoModelForCausalLM\n"
            f"model = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'hf')!r}, trust_remote_code=True)\n"
            f"torch.save(model(torch.tensor({idx.tolist()})).logits.detach(), {str(tmp_path / 'logits.pt')!r})\n")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, capture_output=True)
    with torch.no_grad():
        expected, _ = model(idx)
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected, rtol=0, atol=ATOL)


def test_export_hf_custom_loss_is_gptlabs_next_token_loss(tmp_path):
    model = ours(RECIPE)
    export_hf(model, tmp_path)
    idx = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, expected = model(idx[:, :-1], idx[:, 1:])
        loss = load(tmp_path)(idx, labels=idx).loss
    torch.testing.assert_close(loss, expected, rtol=0, atol=ATOL)


def test_export_hf_refuses_a_switch_the_modeling_code_does_not_know_before_writing(tmp_path, monkeypatch):
    """A ModelConfig field added later is refused at a non-default value, naming the flag that exports."""
    monkeypatch.setattr(export_module, "COMPUTED_FIELDS", export_module.COMPUTED_FIELDS - {"logit_softcap"})
    with pytest.raises(GptlabError, match=r"logit_softcap=15.0 .* --model.logit-softcap 0.0 exports") as error:
        export_hf(ours(RECIPE, logit_softcap=15.0), tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()
    export_hf(ours(RECIPE), tmp_path / "default")  # the field at its default is no switch


# ---------------------------------------------------------------- base and chat models through the CLI


def model_folder(prepared, folder, *, chat: bool):
    tokenizer = Tokenizer.load(prepared / "tokenizer")
    tokenizer = add_chat_tokens(tokenizer) if chat else tokenizer
    model = ours(RECIPE, vocab_size=tokenizer.vocab_size, block_size=128)
    save_model(model, folder)
    tokenizer.save(folder / "tokenizer")
    return model, tokenizer


def test_cli_export_hf_chat_model_keeps_template_stop_token_and_replies(prepared, tmp_path, capsys):
    model, tokenizer = model_folder(prepared, tmp_path / "model", chat=True)
    assert main(["export", "hf", str(tmp_path / "model"), str(tmp_path / "hf")]) == 0
    assert "as custom code (GptlabForCausalLM: load with trust_remote_code=True)" in capsys.readouterr().out
    theirs = load(tmp_path / "hf")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = ChatFormat(tokenizer).prompt(messages)
    assert hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False) == prompt
    end = tokenizer.special_tokens[END]
    assert theirs.generation_config.eos_token_id == [end, tokenizer.eot_id]
    (expected,) = generate(model, [prompt], SamplingConfig(max_new_tokens=16, temperature=0, stop_tokens=(end,)))
    reply = theirs.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=end)[0, len(prompt):].tolist()
    assert reply[: reply.index(end) if end in reply else None] == expected


def ending_at_end_of_turn(model: GPT, prompt: list[int], end: int) -> list[int]:
    """Make the untied model's greedy reply to `prompt` end with <|end|> a few tokens in: swap the output rows of
    <|end|> and of the first token it would emit that it had not emitted before (after the first). The inputs'
    embeddings stay, so the tokens before it are unchanged. Returns the reply gptlab now gives, through <|end|>."""
    (free,) = generate(model, [prompt], SamplingConfig(max_new_tokens=12, temperature=0))
    assert end not in free
    at = next((i for i in range(1, len(free)) if free[i] not in free[:i]), 0)
    with torch.no_grad():
        rows = model.lm_head.weight
        rows[[end, free[at]]] = rows[[free[at], end]]
    (reply,) = generate(model, [prompt], SamplingConfig(max_new_tokens=at + 5, temperature=0))
    assert reply[:at] == free[:at] and reply[at] == end
    return reply[: at + 1]


@pytest.mark.parametrize("native", [False, True])
def test_cli_export_hf_chat_model_stops_at_the_end_of_turn_with_eos_everywhere_agreeing(prepared, tmp_path, capsys, native):
    tokenizer = add_chat_tokens(Tokenizer.load(prepared / "tokenizer"))
    base = preset("gpt2-tiny", tie_embeddings=False) if native else RECIPE  # GPT2LMHeadModel, or our modeling code
    model = ours(base, vocab_size=tokenizer.vocab_size, block_size=128)
    prompt = ChatFormat(tokenizer).prompt([{"role": "user", "content": "What is 2+2?"}])
    end, eot = tokenizer.special_tokens[END], tokenizer.eot_id
    expected = ending_at_end_of_turn(model, prompt, end)
    save_model(model, tmp_path / "model")
    tokenizer.save(tmp_path / "model" / "tokenizer")
    assert main(["export", "hf", str(tmp_path / "model"), str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    generation = transformers.GenerationConfig.from_pretrained(tmp_path / "hf")
    assert hf_tokenizer.eos_token == END and hf_tokenizer.eos_token_id == config.eos_token_id == end
    assert generation.eos_token_id == [end, eot] and generation.pad_token_id == eot
    assert config.bos_token_id == generation.bos_token_id == hf_tokenizer.bos_token_id == eot
    assert json.loads((tmp_path / "hf" / "special_tokens_map.json").read_text())["eos_token"] == END
    assert hf_tokenizer.convert_ids_to_tokens(eot) in hf_tokenizer.all_special_tokens  # still special: decode skips it
    messages = [{"role": "user", "content": "What is 2+2?"}]
    assert hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False) == prompt
    theirs = load(tmp_path / "hf")
    out = theirs.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=20, do_sample=False)[0, len(prompt):].tolist()
    assert out == expected and len(out) < 20  # stopped at <|end|>, with no eos passed by hand


def test_cli_export_hf_base_model_of_the_default_recipe(prepared, tmp_path, capsys):
    model, tokenizer = model_folder(prepared, tmp_path / "model", chat=False)
    assert main(["export", "hf", str(tmp_path / "model"), str(tmp_path / "hf")]) == 0
    assert "as custom code" in capsys.readouterr().out
    theirs = load(tmp_path / "hf")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    ids = hf_tokenizer("ROMEO:\nBut, soft!")["input_ids"]
    assert ids == tokenizer.encode("ROMEO:\nBut, soft!")
    with torch.no_grad():
        torch.testing.assert_close(theirs(torch.tensor([ids])).logits, model(torch.tensor([ids]))[0], rtol=0, atol=ATOL)
