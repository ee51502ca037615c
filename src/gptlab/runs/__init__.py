"""Runs read back: a self-contained HTML report of one run, and comparisons of several.

    write_report("runs/a")                                   # runs/a/report.html
    print(compare_runs(["runs/a", "runs/b"], "ab.png", x="tokens"))
    print(compare_groups(parse_groups(["base=runs/base-seed*", "new=runs/new-seed*"])))   # over seeds

The files a run folder holds for them: metrics.jsonl and train_config.json (gptlab.train), samples.jsonl
(gptlab.runs.samples) and machine.json (gptlab.runs.machine), both written by the Trainer.
Imports gptlab.runtime and gptlab.model only: gptlab.train uses it, never the reverse.
"""

from gptlab.runs.compare import compare_runs
from gptlab.runs.groups import compare_groups, group_figures, load_groups, parse_groups
from gptlab.runs.machine import describe_machine, write_machine
from gptlab.runs.record import RunRecord, load_run
from gptlab.runs.report import write_report
from gptlab.runs.samples import append_sample, read_samples, truncate_samples

__all__ = ["RunRecord", "append_sample", "compare_groups", "compare_runs", "describe_machine", "group_figures", "load_groups",
           "load_run", "parse_groups", "read_samples", "truncate_samples", "write_machine", "write_report"]
