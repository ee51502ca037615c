"""The report of a real tiny run, read back as a browser would: its figures are the metrics log's, nothing is fetched."""

import base64
import json
import os
import platform
import re
import shutil

import pytest
import torch

from gptlab.runs import load_run, write_report
from gptlab.runs.report import REPORT_FILE
from gptlab.runs.samples import read_samples
from gptlab.train import Trainer

from ..train.conftest import tiny_config
from .conftest import MARKUP
from .page import Page


def metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def flatten(config, prefix=""):
    for key, value in config.items():
        if isinstance(value, dict):
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def test_report_shows_the_runs_config_exactly(two_runs):
    folder, _ = two_runs["long"]
    rows = Page((folder / REPORT_FILE).read_text()).tables["Config"][1:]
    config = dict(flatten(json.loads((folder / "train_config.json").read_text())))
    shown = {key: value for key, value in rows}
    assert shown.keys() == config.keys()
    for key, value in config.items():
        assert (shown[key] if isinstance(value, str) else json.loads(shown[key])) == value, key


def test_report_figures_are_the_metrics_logs(two_runs):
    folder, _ = two_runs["long"]
    page = Page((folder / REPORT_FILE).read_text())
    records = metrics(folder)
    evals = [r for r in records if "val_bpb" in r]
    final = {row[0]: row[1:] for row in page.tables["Final"][1:]}
    assert final["val bits per byte"] == [f"{evals[-1]['val_bpb']:.4f}", "9"]
    assert final["best val loss"][0] == f"{min(r['val_loss'] for r in evals):.4f}"
    # an evaluation row per evaluated step; step 3 was not logged (log_every 2): its tokens are interpolated
    assert page.tables["Evaluations"][1:] == [
        [str(r["step"]), f"{r['step'] * 128:,}", f"{r['val_loss']:.4f}", f"{r['val_bpb']:.4f}"] for r in evals]
    summary = dict(zip(*page.tables["Final figures"]))
    train = [r for r in records if "loss" in r]
    assert summary["steps"] == "9" and summary["train loss"] == f"{train[-1]['loss']:.4f}"
    assert summary["params"] == f"{sum(p.numel() for p in load_model_of(folder).parameters()):,}"


def load_model_of(folder):
    from gptlab.model import GPT
    from gptlab.model.io import config_from_dict

    return GPT(config_from_dict(json.loads((folder / "train_config.json").read_text())["model"]))


def test_report_shows_the_samples_the_run_printed_as_text(two_runs):
    folder, printed = two_runs["long"]
    assert [s["text"] for s in read_samples(folder)] == printed and [s["step"] for s in read_samples(folder)] == [3, 6, 9]
    html = (folder / REPORT_FILE).read_text()
    page = Page(html)
    assert page.pres == printed  # markup in a sample arrives as text ...
    assert not any(tag == "b" for tag, _ in page.tags) and MARKUP.startswith("<b>")  # ... never as a tag


def test_report_describes_the_machine(two_runs):
    folder, _ = two_runs["short"]
    machine = dict(Page((folder / REPORT_FILE).read_text()).tables["Machine"][1:])
    cpuinfo = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    if model:
        assert machine["cpu"] == model.group(1).strip()
    assert machine["cores"] == str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    assert machine["torch"] == torch.__version__ and machine["python"] == platform.python_version()
    assert machine["device"] == "cpu" and machine["precision"] == "fp32" and machine["threads"] == str(torch.get_num_threads())
    assert machine["gpu"] == "null" and machine["start_step"] == "0"


def test_report_is_self_contained(two_runs):
    folder, _ = two_runs["short"]
    page = Page((folder / REPORT_FILE).read_text())
    references = [(tag, name, value) for tag, attrs in page.tags for name, value in attrs.items()
                  if value and re.match(r"\s*(https?:|//|file:)", value, re.I)]
    assert references == []
    assert not any(tag in ("script", "link", "iframe", "object") for tag, _ in page.tags)
    images = [attrs["src"] for tag, attrs in page.tags if tag == "img"]
    assert len(images) == 3  # curves, throughput, other figures
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_resumed_runs_samples_and_report_never_mix_two_runs(prepared, tmp_path):
    """Killed after step 6 with its last checkpoint at 3: the resumed run samples steps 4..6 again, as the uninterrupted run did."""
    config = tiny_config(prepared, tmp_path / "straight", sample_every=2, sample_tokens=6)
    sample = _sampler()
    Trainer(config, sample_fn=sample, log=lambda *_: None).fit()
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight", out)
    shutil.rmtree(out / "checkpoints" / "step_000006")
    Trainer(tiny_config(prepared, out, sample_every=2, sample_tokens=6), sample_fn=sample, log=lambda *_: None).fit()
    assert read_samples(out) == read_samples(tmp_path / "straight")
    assert [s["step"] for s in read_samples(out)] == [2, 4, 6]
    assert json.loads((out / "machine.json").read_text())["start_step"] == 3
    elapsed = [r["elapsed"] for r in metrics(out) if "loss" in r]
    assert elapsed == sorted(elapsed)  # training time goes on from the checkpoint's, not from 0
    assert Page((out / REPORT_FILE).read_text()).pres == [s["text"] for s in read_samples(out)]


def _sampler():
    from gptlab.pipeline import text_sampler

    return text_sampler(6)


def test_write_report_rewrites_the_page_from_the_runs_files(two_runs, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(two_runs["short"][0], folder)
    (folder / REPORT_FILE).unlink()
    with open(folder / "samples.jsonl", "a") as handle:
        handle.write(json.dumps({"step": 7, "text": "added later"}) + "\n")
    assert write_report(folder) == folder / REPORT_FILE
    assert "added later" in Page((folder / REPORT_FILE).read_text()).pres
    assert load_run(folder).samples[-1]["text"] == "added later"


@pytest.mark.parametrize("share, refreshed", [(1e9, True), (1e-9, False)])
def test_a_checkpoint_refreshes_the_report_only_while_that_is_cheap(prepared, tmp_path, monkeypatch, share, refreshed):
    """What the last sample (after the last checkpoint, before the final report) finds: step 3's report, or none yet."""
    import gptlab.train.hooks

    monkeypatch.setattr(gptlab.train.hooks, "REPORT_SHARE", share)  # 1e9: every refresh is cheap enough; 1e-9: none is
    out = tmp_path / "run"
    found = []

    def sample(model, tokenizer):
        found.append((out / REPORT_FILE).read_text() if (out / REPORT_FILE).exists() else None)
        return "text"

    Trainer(tiny_config(prepared, out, max_steps=6, checkpoint_every=3), sample_fn=sample, log=lambda *_: None).fit()
    assert len(found) == 1 and (found[0] is not None) == refreshed
    if refreshed:
        assert "step 3 of 6" in found[0]
    assert "step 6 of 6" in (out / REPORT_FILE).read_text()


def test_dpo_and_grpo_runs_get_a_report_with_their_own_figures(chat_model, tmp_path):
    """The align trainers subclass the Trainer: their reports carry their stage's figures (and no write failed)."""
    from gptlab.align.preference.dpo import run_dpo
    from gptlab.align.rl.grpo import run_grpo

    from ..align.test_dpo import dpo_config
    from ..align.test_grpo import grpo_config

    lines = []
    run_dpo(dpo_config(chat_model, tmp_path / "dpo", max_steps=2), log=lines.append)
    run_grpo(grpo_config(chat_model, tmp_path / "grpo", max_steps=1), log=lines.append)
    assert not [line for line in lines if "not written" in line]
    dpo = Page((tmp_path / "dpo" / REPORT_FILE).read_text())
    assert dpo.tables["Evaluations"][0] == ["step", "tokens", "val_loss", "val_margin", "val_accuracy", "val_preference_accuracy"]
    grpo = [r for r in metrics(tmp_path / "grpo") if "loss" in r]
    extra = sorted(set(grpo[0]) - {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu", "elapsed"})
    alts = [attrs["alt"] for tag, attrs in Page((tmp_path / "grpo" / REPORT_FILE).read_text()).tags if tag == "img"]
    drawn = next(alt for alt in alts if alt.startswith("other logged figures: ")).removeprefix("other logged figures: ").split(", ")
    assert extra and set(extra) <= set(drawn)  # the stage's own step figures (rewards, clipped fraction, ...) each get a panel
