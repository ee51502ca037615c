"""report.html of a time-limited run (as `gptlab run` makes: max_steps 10**9, a time limit): its heading names the
time limit, not the step ceiling, and no two tick labels of its curves overlap."""

import math

import pytest

from gptlab.runs import load_run
from gptlab.runs.plots import compact, scientific
from gptlab.runs.record import RunRecord
from gptlab.runs.report import curves_figure, progress, render_report

from .page import Page

STEPS, TOKENS_PER_STEP, SECONDS_PER_STEP = 991, 2048, 180 / 991  # the demo's pretraining: 991 steps in its 180 s


def demo_like_run(two_runs, *, steps=STEPS, tokens_per_step=TOKENS_PER_STEP) -> RunRecord:
    """A time-limited run of `steps` logged steps with the short test run's model config: its curves cover millions
    of tokens and 1e13 FLOPs, as the demo's do."""
    run = load_run(two_runs["short"][0])
    config = {**run.config, "max_steps": 10**9, "time_limit": 180.0}
    records = [{"step": step, "loss": 8.0 / math.sqrt(step), "tokens": step * tokens_per_step, "elapsed": step * SECONDS_PER_STEP,
                "tokens_per_s": tokens_per_step / SECONDS_PER_STEP, "lr": 3e-3} for step in range(1, steps + 1)]
    records += [{"step": step, "val_loss": 7.5 / math.sqrt(step), "val_bpb": 3.0 / math.sqrt(step)} for step in range(100, steps + 1, 100)]
    records.sort(key=lambda record: (record["step"], "loss" not in record))
    return RunRecord(path=run.path, name="demo", config=config, records=records, samples=[], machine=None, command="run")


def test_report_of_a_time_limited_run_names_its_time_limit_not_the_step_ceiling(two_runs):
    html = render_report(demo_like_run(two_runs))
    page = Page(html)
    heading = "".join(page.text).split("Final figures")[0]
    assert "step 991 (time limit 180 s)" in heading
    assert "1,000,000,000" not in html and "1000000000" not in heading


@pytest.mark.parametrize("config, last, elapsed, expected", [
    ({"max_steps": 1000}, 180, None, "step 180 of 1,000"),
    ({"max_steps": 1000, "time_limit": 0}, 180, 20.0, "step 180 of 1,000"),
    ({"max_steps": 10**9, "time_limit": 180}, 180, 60.0, "step 180 (time limit 180 s)"),
    ({"max_steps": 500, "time_limit": 600}, 180, 60.0, "step 180 of 500 (time limit 10 min)"),  # 3 steps/s reach 500 in 600 s
    ({"max_steps": 5000, "time_limit": 600}, 180, 60.0, "step 180 (time limit 10 min)"),  # 1,800 by the limit: it ends first
    ({"max_steps": 5000, "time_limit": 7200}, 10, None, "step 10 (time limit 2 h)"),
    ({"time_limit": 90.5}, 3, 1.0, "step 3 (time limit 90.5 s)"),
    ({}, 0, None, "step 0"),
])
def test_progress_names_the_end_the_run_will_reach_first(config, last, elapsed, expected):
    assert progress(config, last, elapsed) == expected


def test_tick_labels_are_short_numbers():
    assert [compact(value) for value in (0, 180, 2500, 1_200_000, 2_000_000_000, -3000, 0.5)] == \
        ["0", "180", "2.5k", "1.2M", "2G", "-3k", "0.5"]
    assert [scientific(value) for value in (0, 3e15, 1.25e16, 5e11)] == ["0", "3e15", "1.25e16", "5e11"]


def x_tick_boxes(figure, axis) -> list:
    """The window boxes of the x tick labels matplotlib draws inside the panel's width, left to right."""
    renderer = figure.canvas.get_renderer()
    panel = axis.get_window_extent(renderer)
    boxes = [label.get_window_extent(renderer) for label in axis.get_xticklabels() if label.get_visible() and label.get_text()]
    return sorted((box for box in boxes if panel.x0 - 1 <= (box.x0 + box.x1) / 2 <= panel.x1 + 1), key=lambda box: box.x0)


@pytest.mark.parametrize("steps, tokens_per_step", [(STEPS, TOKENS_PER_STEP), (400, TOKENS_PER_STEP), (900, 524_288), (37, 4096)])
def test_no_two_x_tick_labels_of_the_curves_overlap(two_runs, steps, tokens_per_step):
    figure, axes_names = curves_figure(demo_like_run(two_runs, steps=steps, tokens_per_step=tokens_per_step))
    figure.canvas.draw()
    assert axes_names == ["step", "tokens", "time", "flops"]
    for row, x in zip(figure.axes[::2], axes_names):
        boxes = x_tick_boxes(figure, row)
        assert 3 <= len(boxes) <= 6, (x, [label.get_text() for label in row.get_xticklabels()])
        gaps = [right.x0 - left.x1 for left, right in zip(boxes, boxes[1:])]
        assert min(gaps) >= 4, (x, gaps, [label.get_text() for label in row.get_xticklabels()])
        assert row.xaxis.get_offset_text().get_text() == ""  # no "1e6" in a corner to combine with every label
