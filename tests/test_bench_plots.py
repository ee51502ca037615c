"""bench/plot_results.py and the benchmarks page's figures: the plots are drawn from docs/img/bench/results.json,
byte for byte the same on a rerun; every figure in results.json is one the bench printed (in its docs/bench_*.txt
output where one is kept, with that output's machine, date and command) and one the page's section shows; each
ratio the bench printed agrees with its two figures within their rounding; the committed PNGs show the committed
figures; a bad results.json is one error line and writes nothing."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "img" / "bench" / "results.json"
PAGE = ROOT / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def plot():
    """The script as a module (bench/ is not a package: its scripts import from their own folder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "bench"))
        return importlib.import_module("plot_results")


@pytest.fixture(scope="module")
def benchmarks() -> list[dict]:
    return json.loads(RESULTS.read_text(encoding="utf-8"))["benchmarks"]


@pytest.fixture(scope="module")
def drawn(plot, tmp_path_factory) -> Path:
    """The script run as a user runs it, on a copy of results.json: the PNGs land beside it."""
    folder = tmp_path_factory.mktemp("bench_img")
    shutil.copy(RESULTS, folder / "results.json")
    plot.main(["--results", str(folder / "results.json")])
    return folder


def figures(bar: dict) -> list[str]:
    return [bar[key] for key in ("value", "anchor_value", "ratio") if bar.get(key) is not None]


def expected_ratio(bar: dict, quotient: str) -> float:
    """The ratio the chart must show, worked out here from the strings: the printed one, else the quotient."""
    if bar.get("ratio") is not None:
        return float(bar["ratio"])
    value, anchor = (float(bar[key].replace(",", "")) for key in ("value", "anchor_value"))
    return value / anchor if quotient == "value / anchor" else anchor / value


def bounds(text: str) -> tuple[float, float]:
    """The interval a printed figure was rounded from: "2.77" -> (2.765, 2.775)."""
    digits = text.replace(",", "")
    half = 0.5 * 10 ** -(len(digits.split(".")[1]) if "." in digits else 0)
    return float(digits) - half, float(digits) + half


def section(page: str, name: str) -> str:
    """The page's section (between ## headings) that shows the benchmark's plot."""
    found = [part for part in re.split(r"\n## ", page) if f"(img/bench/{name}.png)" in part]
    assert len(found) == 1, f"docs/benchmarks.md shows img/bench/{name}.png in {len(found)} sections, not 1"
    return found[0]


def test_plot_results_writes_one_png_per_benchmark_with_its_ratios_and_no_version(drawn, benchmarks):
    assert sorted(path.name for path in drawn.glob("*.png")) == sorted(f"{b['name']}.png" for b in benchmarks)
    for benchmark in benchmarks:
        image = Image.open(drawn / f"{benchmark['name']}.png")
        assert "Software" not in image.text  # no matplotlib version: the bytes do not change with it
        bars = json.loads(image.text["Description"])["bars"]
        assert [label for label, _, _ in bars] == [bar["label"] for bar in benchmark["bars"]]
        assert [anchor for _, anchor, _ in bars] == [bar["anchor"] for bar in benchmark["bars"]]
        want = [expected_ratio(bar, benchmark["quotient"]) for bar in benchmark["bars"]]
        assert [ratio for _, _, ratio in bars] == pytest.approx(want, rel=1e-12)


def test_plot_results_gives_the_same_bytes_when_rerun(plot, drawn, tmp_path):
    again = plot.write_plots(drawn / "results.json", tmp_path / "again")
    assert again and all(path.read_bytes() == (drawn / path.name).read_bytes() for path in again)


def test_committed_plots_show_the_committed_figures(drawn, benchmarks):
    committed = sorted(path.name for path in RESULTS.parent.glob("*.png"))
    assert committed == sorted(f"{b['name']}.png" for b in benchmarks), "rerun .venv/bin/python bench/plot_results.py"
    for name in committed:
        old, new = Image.open(RESULTS.parent / name).text, Image.open(drawn / name).text
        assert old == new, f"docs/img/bench/{name} is stale: rerun .venv/bin/python bench/plot_results.py"


def test_results_printed_ratios_agree_with_their_figures_within_rounding(benchmarks):
    checked = 0
    for benchmark in benchmarks:
        for bar in benchmark["bars"]:
            if bar.get("ratio") is None or "value" not in bar:
                continue
            (v_low, v_high), (a_low, a_high) = bounds(bar["value"]), bounds(bar["anchor_value"])
            if benchmark["quotient"] == "value / anchor":
                low, high = v_low / a_high, v_high / a_low
            else:
                low, high = a_low / v_high, a_high / v_low
            r_low, r_high = bounds(bar["ratio"])
            assert r_high >= low and r_low <= high, f"{benchmark['name']}, {bar['label']}: {bar['ratio']} not in [{low:.4f}, {high:.4f}]"
            checked += 1
    assert checked > 40


def test_results_figures_are_the_bench_outputs_with_their_machine_date_and_command(benchmarks):
    kept = [b for b in benchmarks if b["source"].startswith("docs/bench_")]
    assert {b["source"] for b in kept} == {f"docs/{path.name}" for path in (ROOT / "docs").glob("bench_*.txt")}
    for benchmark in kept:
        text = (ROOT / benchmark["source"]).read_text(encoding="utf-8")
        header = {key: re.search(rf"^# {key}: (.+)$", text, re.M).group(1).strip() for key in ("machine", "date", "command")}
        if not benchmark.get("arithmetic"):
            assert header["machine"] == benchmark["machine"], benchmark["name"]
        assert (header["date"], header["command"]) == (benchmark["date"], benchmark["command"]), benchmark["name"]
        numbers = set(re.findall(r"\d[\d,]*\.?\d*", text))
        for figure in (f for bar in benchmark["bars"] for f in figures(bar)):
            assert figure in numbers, f"{benchmark['name']}: {figure} is not in {benchmark['source']}"


def test_results_figures_and_commands_are_on_the_benchmarks_page(benchmarks):
    page = PAGE.read_text(encoding="utf-8")
    for benchmark in benchmarks:
        text = section(page, benchmark["name"])
        assert f"```bash\n{benchmark['command']}\n" in text, f"{benchmark['name']}: its command is not in its section's bash block"
        # the section dates the figures and names where they come from: the output file, or the commit that recorded them
        assert benchmark["date"].split()[0] in text and Path(benchmark["source"].split()[-1]).name in text, benchmark["name"]
        numbers = set(re.findall(r"\d[\d,]*\.?\d*", text))
        for figure in (f for bar in benchmark["bars"] for f in figures(bar)):
            assert figure in numbers, f"{benchmark['name']}: {figure} is not in its section of docs/benchmarks.md"


@pytest.mark.parametrize("change, message", [
    (lambda data: data["benchmarks"][0]["bars"][0].pop("ratio") and data["benchmarks"][0]["bars"][0].pop("value"),
     "has neither \"ratio\" nor both \"value\" and \"anchor_value\""),
    (lambda data: data["benchmarks"][1]["bars"][0].update(value="fast", ratio=None), "'fast' is not a number"),
    (lambda data: data.update(format_version=2), "format_version 2, expected 1"),
    (lambda data: data["benchmarks"][2].update(name=data["benchmarks"][0]["name"]), "appear twice"),
    (lambda data: data["benchmarks"][0].pop("command"), "lacks command"),
])
def test_plot_results_bad_results_is_one_error_naming_it_and_writes_nothing(plot, tmp_path, change, message):
    data = json.loads(RESULTS.read_text(encoding="utf-8"))
    change(data)
    (tmp_path / "results.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SystemExit) as error:
        plot.main(["--results", str(tmp_path / "results.json"), "--out", str(tmp_path / "out")])
    assert str(error.value).startswith("plot_results: error: ") and message in str(error.value)
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


def test_plot_results_command_exits_1_with_one_line_for_a_missing_file(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "plot_results.py"), "--results", str(tmp_path / "none.json")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("plot_results: error: ") and result.stderr.count("\n") == 1 and "none.json" in result.stderr
    assert list(tmp_path.iterdir()) == []
