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


def one_record_run(folder, **record):
    """A run folder whose metrics log holds one record: a run stopped after its first logged step."""
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens": 128, "elapsed": 0.5, **record}) + "\n")
    return folder


def test_compare_draws_a_run_of_one_point_as_a_visible_marker(two_runs, tmp_path):
    from gptlab.runs.compare import comparison_figure
    from gptlab.runs.plots import pyplot

    single = one_record_run(tmp_path / "single", loss=3.5, val_bpb=2.25)
    figure = comparison_figure([load_run(two_runs["short"][0]), load_run(single)], "step")
    try:
        loss_axis, bpb_axis = figure.axes
        for axis, value in ((loss_axis, 3.5), (bpb_axis, 2.25)):
            lines = {line.get_label(): line for line in axis.get_lines()}
            dot = lines[str(single)]
            assert dot.get_xydata().tolist() == [[1.0, value]]
            assert dot.get_marker() not in ("None", None, "", " ") and dot.get_markersize() > 0  # a line of one point is invisible
        assert loss_axis.get_lines()[0].get_marker() == "None"  # the curves of many points stay lines
    finally:
        pyplot().close(figure)


@pytest.mark.parametrize("name, content, line", [
    ("metrics.jsonl", b'{"step": 1, "loss": 3.0}\n\n{"step": 2, "loss": 2.9, "note": "caf\xe9"}\n', 3),
    ("samples.jsonl", b'{"step": 1, "text": "\xff\xfe"}\n', 1),
])
def test_compare_names_the_file_and_line_of_bytes_that_are_not_utf8(tmp_path, name, content, line):
    folder = one_record_run(tmp_path / "run", loss=3.0)
    (folder / name).write_bytes(content)
    with pytest.raises(GptlabError) as error:
        compare_runs([folder])
    assert str(error.value).startswith(f"{folder / name} line {line} is not UTF-8 text (byte 0x")


def test_metrics_damage_names_the_files_own_line_past_blank_lines(tmp_path):
    folder = one_record_run(tmp_path / "run", loss=3.0)
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n\n\n{"step": 2, oops}\n{"step": 3, "loss": 2.8}\n')
    with pytest.raises(GptlabError, match=r"metrics.jsonl line 4 is not JSON; the metrics log is damaged"):
        compare_runs([folder])
