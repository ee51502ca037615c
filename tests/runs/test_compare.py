"""Comparing runs: the table's figures are each run's metrics log's, the curves land in a PNG of the promised size."""

import json
import statistics

import matplotlib.image
import pytest

from gptlab.model.accounting import flops_per_token
from gptlab.model.io import config_from_dict
from gptlab.runs import compare_runs, load_run
from gptlab.runs.compare import format_duration
from gptlab.runtime import GptlabError


def expected_row(folder) -> list[str]:
    """The table row computed straight from metrics.jsonl and train_config.json."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    from gptlab.model import GPT

    model = GPT(config_from_dict(json.loads((folder / "train_config.json").read_text())["model"]))
    return [str(folder), f"{train[-1]['step']:,}", f"{train[-1]['tokens']:,}", format_duration(train[-1]["elapsed"]),
            f"{train[-1]['loss']:.4f}", f"{min(val):.4f}", f"{val[-1]:.4f}",
            f"{[r['val_bpb'] for r in records if 'val_bpb' in r][-1]:.4f}",
            f"{statistics.median(r['tokens_per_s'] for r in train):,.0f}", "-", f"{model.num_params():,}"]


def test_compare_tabulates_each_runs_final_figures_and_draws_their_curves(two_runs, tmp_path):
    folders = [two_runs["short"][0], two_runs["long"][0]]
    table = compare_runs(folders, out_png=tmp_path / "compare.png", x="tokens")
    header, *rows = table.splitlines()
    assert header.split() == ["run", "steps", "tokens", "time", "train", "loss", "best", "val", "loss", "val", "loss",
                              "val", "bpb", "tokens/s", "MFU", "params"]
    assert [row.split() for row in rows] == [expected_row(folder) for folder in folders]
    image = matplotlib.image.imread(tmp_path / "compare.png")
    assert image.shape == (320, 960, 4)  # two 6 x 4 inch panels at 80 dpi, RGBA


def test_a_single_run_compares_too(two_runs):
    folder = two_runs["short"][0]
    assert compare_runs([folder]).splitlines()[1].split() == expected_row(folder)


def test_curves_against_time_and_flops_are_the_logs_elapsed_and_tokens_times_flops_per_token(two_runs):
    folder = two_runs["long"][0]
    run = load_run(folder)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    config = json.loads((folder / "train_config.json").read_text())
    per_token = flops_per_token(config_from_dict(config["model"]), config["seq_len"])["training"]
    assert run.series("loss", "time") == ([r["elapsed"] for r in train], [r["loss"] for r in train])
    assert run.series("loss", "flops")[0] == pytest.approx([r["tokens"] * per_token for r in train], rel=1e-12)
    assert run.series("loss", "step")[0] == [r["step"] for r in train]


def test_flops_need_the_runs_model_config(two_runs, tmp_path):
    folder = tmp_path / "no-config"
    folder.mkdir()
    (folder / "metrics.jsonl").write_bytes((two_runs["short"][0] / "metrics.jsonl").read_bytes())
    compare_runs([folder], out_png=tmp_path / "tokens.png", x="tokens")  # fine without a config
    with pytest.raises(GptlabError, match="no train_config.json with a model config, so its FLOPs are unknown"):
        compare_runs([folder], out_png=tmp_path / "flops.png", x="flops")
    assert not (tmp_path / "flops.png").exists()
