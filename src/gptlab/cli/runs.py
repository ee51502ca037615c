"""`gptlab runs`: read finished (or running) training runs back.

    gptlab runs report runs/shakespeare/train            # (re)writes runs/shakespeare/train/report.html
    gptlab runs compare runs/a runs/b --x tokens         # a table of final figures, and runs-compare.png
    gptlab runs compare --group base='runs/base-seed*' --group new='runs/new-seed*'   # over seeds: means, intervals, p

Logic lives in gptlab.runs; this module parses and prints.
"""

from __future__ import annotations

import argparse

from gptlab.runs.record import AXES

DEFAULT_PNG = "runs-compare.png"


def register(stages) -> None:
    parser = stages.add_parser("runs", help="reports of training runs, and comparisons of several")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(parser))
    report = verbs.add_parser("report", help="(re)write RUN/report.html: one self-contained page of the run")
    report.add_argument("run", metavar="RUN", help="a training run's folder (the one that holds metrics.jsonl)")
    report.set_defaults(handler=run_report)
    compare = verbs.add_parser("compare", help="final figures of runs side by side, and their curves overlaid in a PNG")
    compare.add_argument("runs", nargs="*", metavar="RUN", help="training run folders (each holds metrics.jsonl)")
    compare.add_argument("--group", action="append", default=[], metavar="NAME=PATTERN",
                         help="instead of RUNs, a group of runs (e.g. one recipe over seeds): a glob gptlab expands "
                         "(base='runs/base-seed*') or a folder of runs; repeat it for each group. Prints each group's "
                         "mean and std, and each group against the first (difference, 95%% interval, Welch's p)")
    compare.add_argument("--x", choices=AXES, default="step", help="the curves' x axis (default step)")
    compare.add_argument("--out", default=DEFAULT_PNG, metavar="FILE.png",
                         help=f"the PNG to write (default {DEFAULT_PNG}); an existing file is replaced only if an earlier "
                         "comparison made it, or with --force")
    compare.add_argument("--force", action="store_true", help="replace --out even if something else made it")
    compare.set_defaults(handler=run_compare)


def run_report(args: argparse.Namespace) -> int:
    from gptlab.runs import write_report

    print(f"report -> {write_report(args.run)}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from gptlab.runs import compare_groups, compare_runs, parse_groups
    from gptlab.runtime import GptlabError

    if args.group and args.runs:
        raise GptlabError(f"pass run folders or --group NAME=PATTERN, not both (got {' '.join(args.runs)}); "
                          "put those runs in a group of their own")
    if args.group:
        print(compare_groups(parse_groups(args.group), out_png=args.out, x=args.x, force=args.force))
    else:
        print(compare_runs(args.runs, out_png=args.out, x=args.x, force=args.force))
    print(f"curves against {args.x} -> {args.out}")
    return 0
