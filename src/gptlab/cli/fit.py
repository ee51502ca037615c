"""`gptlab fit RESULTS`: scaling laws from a sweep (gptlab.scaling.fit): IsoFLOP minima, N_opt(C) and D_opt(C)
power laws, Chinchilla's parametric L(N, D), all with bootstrap intervals, predictions and plots.

    gptlab fit sweeps/mini                          the sweep folder (or its results.jsonl); writes sweeps/mini/fit/
    gptlab fit sweeps/mini --target 1e15 1e18       predictions at these budgets too
    gptlab train --depth 6 --from-fit sweeps/mini/fit/fit.json --data DIR     train as the fit says

Writes OUT/fit.json (read by --from-fit), OUT/fit.txt (the summary printed here), OUT/isoflops.png,
OUT/power_laws.png and OUT/parametric.png. Progress goes to stderr, a line per stage and per tenth of the
parametric bootstrap (the longest stage); --quiet leaves it out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FIT_FILES = ("fit.json", "fit.txt", "isoflops.png", "power_laws.png", "parametric.png")


def register(stages) -> None:
    from gptlab.cli.sweep import take_negative_numbers

    parser = stages.add_parser("fit", help="fit scaling laws to a sweep: IsoFLOP minima, power laws, L(N, D), predictions",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", metavar="RESULTS", help="a sweep folder (made by `gptlab sweep`) or its results.jsonl")
    parser.add_argument("--out", metavar="DIR", help="where to write the fit (default: RESULTS/fit, or fit/ beside a results file)")
    parser.add_argument("--target", nargs="+", default=[], metavar="C", help="FLOP budgets to predict at (default: the sweep's "
                        "largest x10 and x1000)")
    parser.add_argument("--count", choices=["total", "non_embedding", "matmul", "active"],
                        help="the N the laws are stated in (default: the sweep's)")
    parser.add_argument("--loss", default="val_loss", choices=["val_loss", "train_loss", "val_bpb"], help="the loss fitted (default val_loss)")
    parser.add_argument("--samples", type=int, default=500, help="bootstrap resamples for the intervals (default 500: about 30 s for 12 runs)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run)
    take_negative_numbers(parser)


def run(args: argparse.Namespace) -> int:
    import json

    from gptlab.cli.sweep import _numbers
    from gptlab.runtime import GptlabError, atomic_write_text, check_out_dir
    from gptlab.scaling import plots
    from gptlab.scaling.fit import fit_results, summary
    from gptlab.scaling.sweep import read_rows

    given = _numbers(args.target, "--target") if args.target else None  # the flags first: cheap, and not the results' fault
    if args.samples < 0:
        raise GptlabError(f"--samples must be 0 or more, got {args.samples}")
    source = Path(args.results)
    if not source.exists():
        raise GptlabError(f"{source} does not exist; pass a sweep folder (made by `gptlab sweep`) or its results.jsonl")
    out = Path(args.out) if args.out else (source / "fit" if source.is_dir() else source.parent / "fit")
    check_out_dir(out, FIT_FILES)
    rows = read_rows(source)
    counts = {row.get("count") for row in rows if isinstance(row.get("count"), str)}
    count = args.count or (counts.pop() if len(counts) == 1 else "total")
    budgets = [row.get("budget") for row in rows if row.get("status") == "finished" and isinstance(row.get("budget"), (int, float))]
    targets = given if given is not None else tuple(max(budgets) * f for f in (10, 1000)) if budgets else ()
    fit = fit_results(rows, count=count, loss=args.loss, targets=targets, samples=args.samples, seed=args.seed,
                      progress=None if args.quiet else _progress)
    fit["results"] = str(source)
    text = summary(fit)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "fit.json", json.dumps(fit, indent=1) + "\n")
    atomic_write_text(out / "fit.txt", text + "\n")
    if not args.quiet:
        _progress("fit: drawing the plots")
    drawn = [plots.plot_isoflops(fit, rows, out / "isoflops.png"), plots.plot_power_laws(fit, out / "power_laws.png"),
             plots.plot_parametric(fit, rows, out / "parametric.png")]
    print(text)
    print(f"wrote {out}: fit.json, fit.txt" + "".join(f", {path.name}" for path in drawn if path))
    return 0


def _progress(line: str) -> None:
    """A stage of the fit, on stderr so that stdout stays the summary."""
    print(line, file=sys.stderr, flush=True)
