"""Supervised fine-tuning end to end: the CLI, what the loss counts, exact resume, and mistakes caught before compute."""

import dataclasses
import json
import shutil

import pytest
import torch

from gptlab.align.finetune.sft import SFTConfig, SFTTrainer, run_sft
from gptlab.chat import CHAT_TOKENS, TOOL_TOKENS, ChatFormat
from gptlab.cli.main import main
from gptlab.data.match import find_model_tokenizer
from gptlab.load.checkpoints import list_checkpoints
from gptlab.model import preset
from gptlab.model.io import load_model
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer
from gptlab.train import Trainer
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig

from ..train.conftest import tiny_config

DATA = "task:arithmetic[n=200], task:spelling[n=200]"


@pytest.fixture(scope="module")
def base(prepared, tmp_path_factory):
    """A tiny pretrained model run (4 steps), with its tokenizer in its checkpoints."""
    out = tmp_path_factory.mktemp("base") / "run"
    config = tiny_config(prepared, out, model=preset("gpt2-tiny", vocab_size=512, block_size=64), seq_len=64,
                         batch_tokens=4 * 64, max_steps=4)
    Trainer(config, log=lambda *_: None).fit()
    return out


def sft_config(base, out, **changes) -> SFTConfig:
    config = SFTConfig(
        data=DATA, init_from=str(base), out=str(out), model=preset("gpt2-tiny", vocab_size=512, block_size=64),
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0), schedule=ScheduleConfig(kind="cosine", warmup_steps=1),
        batch_tokens=8 * 64, micro_batch=8, seq_len=64, max_steps=4, precision="fp32", device="cpu",
        eval_every=2, eval_batches=2, checkpoint_every=2, log_every=1, task_examples=8,
    )
    return dataclasses.replace(config, **changes)


def quiet_sft(config, **kwargs):
    return run_sft(config, log=lambda *_: None, **kwargs)


def test_sft_grows_the_vocabulary_and_saves_a_chat_model(base, tmp_path):
    result = quiet_sft(sft_config(base, tmp_path / "sft"))
    assert result.status == "finished" and len(result.train.losses) == 4
    assert set(result.before) == set(result.after) == {"arithmetic_accuracy", "spelling_accuracy"}
    checkpoint = list_checkpoints(tmp_path / "sft")[-1]
    tokenizer = find_model_tokenizer(checkpoint)
    model = load_model(checkpoint)
    assert all(token in tokenizer.special_tokens for token in (*CHAT_TOKENS, *TOOL_TOKENS))
    assert model.config.vocab_size == tokenizer.vocab_size == 512 + len(CHAT_TOKENS) + len(TOOL_TOKENS)
    ChatFormat(tokenizer)  # the saved tokenizer renders conversations
    records = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert any("val_loss" in r for r in records) and (tmp_path / "sft" / "loss.png").is_file()


def test_sft_micro_batches_equal_one_big_batch(base, tmp_path):
    """The loss is the mean over all assistant tokens of the step: 8 rows at once == 8 micro-steps of 1 row."""
    one = quiet_sft(sft_config(base, tmp_path / "one", max_steps=2, tasks="none"))
    split = quiet_sft(sft_config(base, tmp_path / "split", max_steps=2, micro_batch=1, tasks="none"))
    assert split.train.losses == pytest.approx(one.train.losses, rel=1e-5)
    wa = load_model(list_checkpoints(tmp_path / "one")[-1]).state_dict()
    wb = load_model(list_checkpoints(tmp_path / "split")[-1]).state_dict()
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows", ["pack", "pad"])
def test_sft_resumes_exactly(base, tmp_path, rows):
    config = sft_config(base, tmp_path / "straight", rows=rows, tasks="none")
    straight = quiet_sft(config)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000004")
    resumed = quiet_sft(dataclasses.replace(config, out=str(tmp_path / "resumed")))
    assert resumed.train.losses == straight.train.losses[2:]


def test_sft_first_step_loss_counts_only_assistant_tokens(base, tmp_path):
    """Step 1's loss == cross-entropy over the assistant targets of the first batch, computed by hand."""
    config = sft_config(base, tmp_path / "sft", max_steps=1, tasks="none")
    trainer = SFTTrainer(config, log=lambda *_: None)
    loader = trainer._loader("train")
    x, y, kwargs = loader.next_batch()
    from gptlab.model.hf import load_pretrained_directory
    from gptlab.model.resize import grow_vocab

    model = grow_vocab(load_pretrained_directory(trainer.init_path), trainer.tokenizer.vocab_size, new_from=512)
    logits, _ = model(x, **kwargs)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
    chat = ChatFormat(trainer.tokenizer)
    assert set(y[y != -100].tolist()) >= {chat.end}
    assert trainer.fit().losses[0] == pytest.approx(expected.item(), rel=1e-5)


def test_sft_refuses_bad_input_before_compute_and_leaves_nothing(base, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
                   '{"messages": [{"role": "wizard", "content": "hi"}]}\n')
    with pytest.raises(GptlabError, match=r"bad.jsonl:2"):
        SFTTrainer(sft_config(base, tmp_path / "out", data=str(bad), on_error="refuse"), log=lambda *_: None)
    with pytest.raises(GptlabError, match="--init"):
        SFTTrainer(sft_config(base, tmp_path / "out", init_from=""), log=lambda *_: None)
    with pytest.raises(GptlabError, match=r"--seq-len 128 is longer than the context of the model it starts from .*block_size 64\); pass --seq-len 64"):
        SFTTrainer(sft_config(base, tmp_path / "out", seq_len=128, batch_tokens=8 * 128), log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_sft_command_runs_and_reports_accuracy_and_errors_in_one_line(base, tmp_path, capsys):
    chats = tmp_path / "chats.jsonl"
    lines = [{"messages": [{"role": "user", "content": f"Say {word}."}, {"role": "assistant", "content": word}]}
             for word in ("alas", "forsooth", "anon", "prithee") * 10]
    chats.write_text("\n".join(json.dumps(line) for line in lines) + "\n{not json\n")
    args = ["sft", "--init", str(base), "--data", f"{chats}@2, task:arithmetic[n=100]", "--out", str(tmp_path / "sft"),
            "--max-steps", "2", "--batch-tokens", "512", "--micro-batch", "8", "--seq-len", "64", "--eval-every", "1",
            "--task-examples", "4", "--precision", "fp32"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "chats.jsonl:41" in out and "arithmetic_accuracy" in out and "finished after 2 steps" in out
    assert main([*args[:-2], "--on-error", "refuse"]) == 1
    assert "chats.jsonl:41" in capsys.readouterr().err
    assert main(["sft", "--init", str(tmp_path / "nowhere"), "--data", DATA]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nowhere" in err
    assert main(["sft", "--init", str(base), "--data", DATA, "--model.n-layer", "3"]) == 1
    assert "--model.n-layer" in capsys.readouterr().err


def test_sft_base_tokenizer_must_match_the_model(base, prepared, tmp_path):
    from gptlab.data.corpus import shakespeare_documents

    other = Tokenizer.train(shakespeare_documents()[6:8], vocab_size=512)
    other.save(tmp_path / "other")
    with pytest.raises(GptlabError, match="is not the tokenizer saved with"):
        SFTTrainer(sft_config(base, tmp_path / "out", tokenizer=str(tmp_path / "other")), log=lambda *_: None)
    SFTTrainer(sft_config(base, tmp_path / "out", tokenizer=str(prepared / "tokenizer")), log=lambda *_: None)  # its own: fine


SFT_DDP_SCRIPT = """
import sys
from pathlib import Path
from gptlab.align.finetune.sft import run_sft
from tests.align.test_sft import sft_config
result = run_sft(sft_config(Path(sys.argv[1]), Path(sys.argv[2]), micro_batch=4, max_steps=2, task_examples=4),
                 log=lambda *_: None)
print(f"status {result.status}", flush=True)  # one write: the ranks' lines never interleave
"""


def test_sft_runs_on_two_gloo_ranks(base, tmp_path):
    """Under torchrun every rank reads its own conversations; the checkpoint holds both ranks' loader states."""
    from ..train.test_trainer import run_on_two_ranks

    result = run_on_two_ranks(SFT_DDP_SCRIPT, base, tmp_path)
    assert result.stdout.count("status finished") == 2
    state = json.loads((list_checkpoints(tmp_path / "ddp")[-1] / "trainer_state.json").read_text())
    assert [loader["rank"] for loader in state["loader"]] == [0, 1]


def test_sft_command_holds_out_the_same_conversations_however_the_file_is_named(base, tmp_path, monkeypatch, capsys):
    """world/sft.jsonl and ./world/sft.jsonl: one held-out split, so one model and the same val loss."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "world").mkdir()
    lines = [{"messages": [{"role": "user", "content": f"Say {word} {i}."}, {"role": "assistant", "content": f"{word} {i}"}]}
             for i, word in enumerate(("alas", "forsooth", "anon", "prithee") * 10)]
    (tmp_path / "world" / "sft.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    def val_losses(data: str, out: str) -> list:
        assert main(["sft", "--init", str(base), "--data", data, "--out", out, "--max-steps", "2", "--batch-tokens", "512",
                     "--micro-batch", "8", "--seq-len", "64", "--eval-every", "1", "--val-fraction", "0.25",
                     "--task-examples", "1", "--precision", "fp32", "--device", "cpu"]) == 0
        rows = [json.loads(line) for line in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]
        return [(row["step"], row["val_loss"]) for row in rows if "val_loss" in row]

    plain = val_losses("world/sft.jsonl", "a")
    assert len(plain) >= 2 and plain == val_losses("./world/sft.jsonl", "b")
