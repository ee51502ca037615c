"""Finding the model a user names and the tokenizer that goes with it (gptlab.load.model_folders)."""

import pytest
import torch

from gptlab.load.model_folders import find_model, load_model, load_model_tokenizer
from gptlab.model import GPT, preset
from gptlab.model.io import save_model
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer


def test_load_model_gives_the_saved_weights_and_their_own_tokenizer(chat_model):
    model, folder = load_model(str(chat_model))
    assert folder == find_model(str(chat_model)) == chat_model
    saved = Tokenizer.load(chat_model / "tokenizer")
    tokenizer, name = load_model_tokenizer(str(chat_model), folder, model, None)
    assert tokenizer.fingerprint() == saved.fingerprint() and name == f"the tokenizer saved with {chat_model}"
    torch.manual_seed(0)  # the chat_model fixture's weights
    expected = GPT(preset("gpt2-tiny", vocab_size=saved.vocab_size, block_size=256))
    for (key, ours), (_, theirs) in zip(sorted(model.state_dict().items()), sorted(expected.state_dict().items()), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=key)


def test_load_model_tokenizer_refuses_a_tokenizer_with_more_ids_than_the_model(chat_model, prepared, tmp_path):
    save_model(GPT(preset("gpt2-tiny", vocab_size=512, block_size=64)), tmp_path / "base")
    model, folder = load_model(str(tmp_path / "base"))
    assert load_model_tokenizer("base", folder, model, None, required=False) == (None, "")
    with pytest.raises(GptlabError, match=r"^no tokenizer saved with base .*; pass --tokenizer DIR \(or gpt2\)$"):
        load_model_tokenizer("base", folder, model, None)
    with pytest.raises(GptlabError, match=r"has 51\d ids but the model only 512: is it the model's tokenizer"):
        load_model_tokenizer("base", folder, model, str(chat_model / "tokenizer"))
    tokenizer, name = load_model_tokenizer("base", folder, model, str(prepared / "tokenizer"))
    assert tokenizer.vocab_size == 512 and name == str(prepared / "tokenizer")
