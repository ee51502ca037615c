"""Groups of runs compared over seeds: each group's mean and spread, and each group against the first.

    groups = parse_groups(["base=runs/base-seed*", "muon=runs/muon-seed*"])   # {"base": [Path(...), ...], ...}
    print(compare_groups(groups, out_png="seeds.png"))

    mean ± sample std over each group's runs:
    metric              base (n=3)       muon (n=3)
    val bpb        2.4872 ± 0.0027  2.4835 ± 0.0053
    ...
    muon - base: difference of means, 95% interval and two-sided p of Welch's t-test
    metric         difference        95% interval     p   df
    val bpb           -0.0037  -0.0148 to +0.0073  0.36  2.9

A change to a recipe counts when it beats the old one over seeds, not on one run: the figures are each
run's final ones (gptlab.runs.record.RunRecord.summary), the mean with the sample standard deviation
(n - 1) per group, then the difference of means (group - first) with its 95% interval from Welch's t
distribution, whose degrees of freedom are Welch-Satterthwaite's, and Welch's two-sided p-value
(scipy.stats.ttest_ind with equal_var=False). Groups of fewer than 3 runs are warned about: their
intervals and p-values say little. A pattern is a glob gptlab expands itself, or a folder: a run, or a
folder whose subfolders are runs.
Not here: the table of single runs and the curves' PNG (gptlab.runs.compare).
"""

from __future__ import annotations

import glob
import math
import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from gptlab.runs.compare import check_request, text_table, write_curves
from gptlab.runs.record import METRICS_FILE, RunRecord, load_run
from gptlab.runtime import GptlabError

# (summary key, title, format of a figure): the metrics compared, in order
METRICS = (
    ("val_bpb", "val bpb", "{:.4f}"), ("final_val_loss", "val loss", "{:.4f}"), ("best_val_loss", "best val loss", "{:.4f}"),
    ("final_loss", "train loss", "{:.4f}"), ("tokens_per_s", "tokens/s", "{:,.0f}"), ("steps", "steps", "{:,.1f}"),
)
FEW_SEEDS = 3  # modded-nanogpt's records ask for at least this many runs a side
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Spread:
    """One metric of one group: its runs' mean and sample standard deviation."""

    group: str
    metric: str
    n: int  # the group's runs that logged the metric
    mean: float
    std: float | None  # n - 1 in the denominator; None for one run


@dataclass(frozen=True)
class Difference:
    """One metric of one group against the first: mean(group) - mean(baseline), its interval and Welch's p."""

    group: str
    baseline: str
    metric: str
    difference: float | None  # None when a side logged the metric in no run
    low: float | None  # the 95% interval; None with `missing` saying why
    high: float | None
    p: float | None  # Welch's two-sided p-value
    df: float | None  # Welch-Satterthwaite degrees of freedom
    missing: str = ""  # why there is no interval: "n=1", "no spread", "not logged"


@dataclass
class GroupFigures:
    runs: dict[str, list[RunRecord]]
    spreads: list[Spread]
    differences: list[Difference]

    def warnings(self) -> list[str]:
        """A line for each group of too few runs to trust an interval."""
        return [f"group {name} has {len(runs)} run{'s' if len(runs) != 1 else ''}: fewer than {FEW_SEEDS} seeds, "
                "intervals and p-values are unreliable" for name, runs in self.runs.items() if len(runs) < FEW_SEEDS]


def parse_groups(specs: list[str]) -> dict[str, list[Path]]:
    """["base=runs/base-*", ...] -> {"base": [runs/base-seed1337, ...]}: each NAME=PATTERN's run folders."""
    groups: dict[str, list[Path]] = {}
    for spec in specs:
        name, equals, pattern = spec.partition("=")
        name, pattern = name.strip(), pattern.strip()
        if not equals or not name or not pattern:
            raise GptlabError(f"--group {spec!r} is not NAME=PATTERN; pass e.g. --group base='runs/base-seed*'")
        if name in groups:
            raise GptlabError(f"--group {name} is given twice; give each group its own name")
        groups[name] = expand_pattern(name, pattern)
    return groups


def expand_pattern(name: str, pattern: str) -> list[Path]:
    """A glob's matches in natural order (seed9 before seed10), or a folder: itself if a run, else its runs."""
    if glob.escape(pattern) != pattern:
        found = sorted(glob.glob(pattern), key=natural_key)
        if not found:
            raise GptlabError(f"--group {name}={pattern} matches nothing; check the folder names in the pattern")
        return [Path(path) for path in found]
    folder = Path(pattern)
    if folder.is_dir() and not (folder / METRICS_FILE).is_file():
        inner = sorted((path for path in folder.iterdir() if (path / METRICS_FILE).is_file()), key=natural_key)
        if inner:
            return inner
    return [folder]  # a run, or what load_run names as not one


def natural_key(path: str | os.PathLike) -> list:
    """"run-seed10" -> ["run-seed", 10, ""]: numbers in names compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def load_groups(groups: dict[str, list[str | os.PathLike]]) -> dict[str, list[RunRecord]]:
    """Each group's runs read back, named group/run for the curves; a run in two groups is refused."""
    if not groups:
        raise GptlabError("no groups to compare: pass --group NAME=PATTERN once per group")
    owner: dict[Path, str] = {}
    loaded = {}
    for name, paths in groups.items():
        if not paths:
            raise GptlabError(f"group {name} has no runs; give it one or more run folders")
        for path in paths:
            if (other := owner.setdefault(Path(path).resolve(), name)) != name:
                raise GptlabError(f"{path} is in both group {other} and group {name}; a run belongs to one group")
        short = len({Path(path).name for path in paths}) == len(paths)  # folder names tell the runs apart
        loaded[name] = [load_run(path, name=f"{name}/{Path(path).name if short else path}") for path in paths]
    return loaded


def group_figures(runs: dict[str, list[RunRecord]]) -> GroupFigures:
    """The numbers behind the comparison: a Spread per group and metric, a Difference per later group and metric."""
    summaries = {name: [run.summary() for run in group] for name, group in runs.items()}
    values = {name: {key: [s[key] for s in group if s[key] is not None] for key, _, _ in METRICS}
              for name, group in summaries.items()}
    logged = [key for key, _, _ in METRICS if any(values[name][key] for name in values)]  # no run has it: left out
    spreads = [Spread(name, key, len(figures[key]), statistics.fmean(figures[key]),
                      statistics.stdev(figures[key]) if len(figures[key]) > 1 else None)
               for name, figures in values.items() for key in logged if figures[key]]
    baseline, *others = values
    differences = [welch_difference(name, baseline, key, values[name][key], values[baseline][key])
                   for name in others for key in logged]
    return GroupFigures(runs, spreads, differences)


def welch_difference(group: str, baseline: str, metric: str, values: list[float], base: list[float]) -> Difference:
    """mean(values) - mean(base) with Welch's 95% interval and two-sided p-value."""
    if not values or not base:
        return Difference(group, baseline, metric, None, None, None, None, None, "not logged")
    difference = statistics.fmean(values) - statistics.fmean(base)
    if len(values) < 2 or len(base) < 2:
        return Difference(group, baseline, metric, difference, None, None, None, None, "n=1")
    if statistics.variance(values) == 0 and statistics.variance(base) == 0:  # t is 0/0 or infinite: no test to do
        return Difference(group, baseline, metric, difference, None, None, None, None, "no spread")
    from scipy import stats

    result = stats.ttest_ind(values, base, equal_var=False)
    if hasattr(result, "confidence_interval"):  # scipy >= 1.11
        low, high = result.confidence_interval(CONFIDENCE)
        df = result.df
    else:
        low, high, df = welch_interval(values, base)
    return Difference(group, baseline, metric, difference, float(low), float(high), float(result.pvalue), float(df))


def welch_interval(values: list[float], base: list[float]) -> tuple[float, float, float]:
    """(low, high, df): diff ± t.ppf(0.975, df) · se, se² = s1²/n1 + s2²/n2, df by Welch-Satterthwaite
    (se⁴ / ((s1²/n1)² / (n1 - 1) + (s2²/n2)² / (n2 - 1))); for a scipy without confidence_interval()."""
    from scipy import stats

    a, b = statistics.variance(values) / len(values), statistics.variance(base) / len(base)
    df = (a + b) ** 2 / (a**2 / (len(values) - 1) + b**2 / (len(base) - 1))
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, df) * math.sqrt(a + b)
    difference = statistics.fmean(values) - statistics.fmean(base)
    return difference - half, difference + half, df


def spread_rows(figures: GroupFigures) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): a row per metric, a "mean ± std" cell per group."""
    found = {(s.group, s.metric): s for s in figures.spreads}
    headers = ["metric"] + [f"{name} (n={len(runs)})" for name, runs in figures.runs.items()]
    rows = []
    for key, title, pattern in METRICS:
        if not any(metric == key for _, metric in found):
            continue
        cells = []
        for name, runs in figures.runs.items():
            spread = found.get((name, key))
            cell = "-" if spread is None else pattern.format(spread.mean) + (
                " (n=1: no std)" if spread.std is None else f" ± {pattern.format(spread.std)}")
            cells.append(cell + (f" (n={spread.n})" if spread and spread.std is not None and spread.n != len(runs) else ""))
        rows.append([title, *cells])
    return headers, rows


def difference_rows(figures: GroupFigures, group: str) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): `group` against the first, a row per metric."""
    rows = []
    for row in (d for d in figures.differences if d.group == group):
        pattern = next(pattern for key, _, pattern in METRICS if key == row.metric)
        signed = pattern.replace("{:", "{:+")
        interval = (f"{signed.format(row.low)} to {signed.format(row.high)}" if row.low is not None else f"- ({row.missing})")
        rows.append([next(title for key, title, _ in METRICS if key == row.metric),
                     "-" if row.difference is None else signed.format(row.difference), interval,
                     "-" if row.p is None else f"{row.p:.2g}", "-" if row.df is None else f"{row.df:.1f}"])
    return ["metric", "difference", f"{CONFIDENCE:.0%} interval", "p", "df"], rows


def compare_groups(groups: dict[str, list[str | os.PathLike]], out_png: str | os.PathLike | None = None, x: str = "step",
                   *, force: bool = False) -> str:
    """The groups' spreads and each later group against the first, as text (warnings first); with `out_png`,
    every run's curves against `x` in that PNG, labelled group/run."""
    check_request(out_png, x, force)
    runs = load_groups(groups)
    if out_png is not None:
        write_curves([run for group in runs.values() for run in group], out_png, x)
    figures = group_figures(runs)
    parts = ["\n".join(f"warning: {line}" for line in figures.warnings()),
             "mean ± sample std over each group's runs:\n" + text_table(*spread_rows(figures))]
    baseline, *others = runs
    for name in others:
        parts.append(f"{name} - {baseline}: difference of means, {CONFIDENCE:.0%} interval and two-sided p of Welch's t-test\n"
                     + text_table(*difference_rows(figures, name)))
    return "\n\n".join(part for part in parts if part)
