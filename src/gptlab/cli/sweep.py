"""`gptlab sweep`: model sizes x FLOP budgets, each run trained for the tokens that spend its budget (gptlab.scaling.sweep).

    gptlab sweep --data data/sp512 --budgets 1e12 3e12 1e13 --sizes 1x64 2x64 2x128 4x128 --out sweeps/mini
    gptlab sweep ... --dry-run                 the grid, its tokens, steps and epochs; nothing is trained (points
                                               under --min-steps are marked, and the command exits 1 naming them)
    gptlab sweep ... --slurm                   writes OUT/sweep.sbatch, a job array of the same grid, and trains nothing

The base of every run is a training preset with dotted overrides, as in `gptlab train` (--data, --batch-tokens,
--optimizer.lr, ...). Rerunning the same command skips finished runs, resumes a killed one and retries failed ones;
more budgets, sizes or lr scales may be added to a sweep later. `gptlab fit OUT` fits the laws.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

# a token that starts like a negative number is a value, never a flag: argparse before 3.13 knows only -1 and -.5,
# so `--target -1e14` ended in "expected at least one argument" instead of the check that explains it
NEGATIVE_NUMBER = re.compile(r"-(\.?\d|inf|nan)", re.IGNORECASE)


def take_negative_numbers(parser: argparse.ArgumentParser) -> None:
    """Let `-1e14` (and -inf, -1e12,3e12) reach its flag as a value; these parsers have no flag like -1."""
    parser._negative_number_matcher = NEGATIVE_NUMBER


def _numbers(values: list[str], flag: str, what: str = "FLOP budgets") -> tuple[float, ...]:
    """1e12 3e12 or 1e12,3e12 -> (1e12, 3e12); each must be a positive, finite number."""
    from gptlab.runtime import GptlabError

    numbers = []
    for item in (item for value in values for item in value.split(",") if item):
        try:
            number = float(item)
        except ValueError:
            raise GptlabError(f"{flag} takes numbers (1e12 3e12 or 1e12,3e12), got {' '.join(values)}") from None
        if not (math.isfinite(number) and number > 0):
            raise GptlabError(f"{flag} takes positive numbers ({what}), got {item}")
        numbers.append(number)
    return tuple(numbers)


def register(stages) -> None:
    from gptlab.cli.train import DEFAULT_PRESET

    parser = stages.add_parser("sweep", help="scaling-law sweep: model sizes x FLOP budgets, resumable, or a SLURM array",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", nargs="+", required=True, metavar="C", help="FLOP budgets, 6 N D each (1e12 3e12 1e13)")
    parser.add_argument("--sizes", nargs="+", required=True, metavar="SIZE",
                        help="depths (4: nanochat's shape, width 64 x depth), shapes LAYERSxWIDTH (2x128) or model presets")
    parser.add_argument("--lr-scales", nargs="+", default=["1"], metavar="X",
                        help="multiples of each size's lr (the depth dial's sqrt-width rule); several let `gptlab fit` fit an lr law")
    parser.add_argument("--count", default="total", choices=["total", "non_embedding", "matmul", "active"],
                        help="the N of C = 6 N D: total (Chinchilla, default), non_embedding (Kaplan), matmul, or active "
                        "(what a token multiplies: = matmul for dense, top_k experts for MoE; fits dense and MoE together)")
    parser.add_argument("--head-dim", type=int, default=64, help="head size of LAYERSxWIDTH shapes (default 64)")
    parser.add_argument("--min-steps", type=int, default=20, help="refuse grid points with fewer optimizer steps (default 20)")
    parser.add_argument("--tokens-per-param", nargs=2, type=float, metavar=("LOW", "HIGH"),
                        help="run only the grid points with LOW <= D/N <= HIGH: each budget's sizes near its optimum")
    parser.add_argument("--preset", default=DEFAULT_PRESET, help=f"the training preset under every run (default {DEFAULT_PRESET})")
    parser.add_argument("--out", required=True, metavar="DIR", help="the sweep's folder (rerun to resume)")
    parser.add_argument("--index", type=int, metavar="I", help="run only grid point I (0-based; what each SLURM task does)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the whole grid and stop (exit 1 if a point has fewer than --min-steps steps: it is marked)")
    parser.add_argument("--slurm", action="store_true", help="write OUT/sweep.sbatch (a job array) instead of training")
    parser.add_argument("--force", action="store_true", help="start over: clear the sweep in --out (its own files only)")
    parser.set_defaults(handler=run, accepts_overrides=True)
    take_negative_numbers(parser)


def run(args: argparse.Namespace) -> int:
    from gptlab.cli.train import resolve_config
    from gptlab.data.shards import read_manifest
    from gptlab.runtime import GptlabError
    from gptlab.scaling.sweep import SweepConfig, describe_plan, plan, refuse_short, run_sweep, write_slurm_script

    base = resolve_config(args.preset, args.overrides)
    if not base.data:
        raise GptlabError("no training data: pass --data DIR (made by `gptlab data prepare`)")
    sweep = SweepConfig(budgets=_numbers(args.budgets, "--budgets"), sizes=tuple(args.sizes),
                        lr_scales=_numbers(args.lr_scales, "--lr-scales", "multiples of each size's lr"), count=args.count,
                        head_dim=args.head_dim, min_steps=args.min_steps,
                        tokens_per_param=tuple(args.tokens_per_param) if args.tokens_per_param else None)
    points = plan(base, sweep, args.out, allow_short=True)  # the whole grid is shown, its short points marked
    print(describe_plan(points, sweep, read_manifest(base.data)["splits"]["train"]["tokens"]))
    refuse_short(points, sweep)  # a dry run too: it shows the grid, then says what the real run would refuse
    if args.dry_run:
        return 0
    if args.slurm:
        path = write_slurm_script(base, sweep, args.out, _command(args), force=args.force)
        print(f"wrote {path}: {len(points)} array tasks; submit with `sbatch {path}`, then `gptlab fit {args.out}`")
        return 0
    rows = run_sweep(base, sweep, args.out, index=args.index, force=args.force)
    failed = [row for row in rows if row["status"] != "finished"]
    print(f"{len(rows) - len(failed)} of {len(rows)} runs finished; rows in {args.out}/results.jsonl; fit with `gptlab fit {args.out}`")
    if failed:
        print(f"{len(failed)} did not ({', '.join(row['run'] + ' ' + row['status'] for row in failed)}); "
              "rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0


def _command(args: argparse.Namespace) -> list[str]:
    """This sweep as a `gptlab sweep` command line (what each SLURM task runs, with its --index)."""
    return ["sweep", "--budgets", *args.budgets, "--sizes", *args.sizes, "--lr-scales", *args.lr_scales, "--count", args.count,
            "--head-dim", str(args.head_dim), "--min-steps", str(args.min_steps),
            *(["--tokens-per-param", *map(str, args.tokens_per_param)] if args.tokens_per_param else []), "--preset", args.preset, "--out", args.out,
            *args.overrides]
