"""`fedhet compare`: a grid of runs (docs/grids.md), tabulated; `--resume` continues one."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from fedhet.cli.common import (
    RUN_FLAGS,
    add_pool_flags,
    add_precision_flag,
    add_setting_flags,
    cluster,
    overrides,
    stack_runs,
)
from fedhet.configs import resolve as resolve_config
from fedhet.errors import FedhetError


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    cmp = sub.add_parser(
        "compare", help="run a grid of experiments (docs/grids.md) and tabulate it",
        description="Run a grid file (--config), optionally changed on the command line, or a "
                    "grid written on the command line alone: setting flags and --set fix a "
                    "setting in every run (replacing the grid's axis of it), --sweep and comma "
                    "lists in -a/-d/-p/-m make axes. Example: fedhet compare -a fedavg,fedprox "
                    "-d digits --sweep lr=0.01,0.1 --sweep seed=0,1,2 --out g",
    )
    add_setting_flags(cmp, "grid TOML file, or a shipped grid's name (fedhet list)")
    add_precision_flag(cmp)
    cmp.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                     help="an axis: one run per value, crossed with the other axes (repeatable)")
    cmp.add_argument("--out", "-o", help="grid directory (runs/, results.csv, summary.md; "
                     "default: a new runs/<name>-<time>/)")
    cmp.add_argument("--dry-run", action="store_true",
                     help="list the runs and their settings, checked, without running anything")
    cmp.add_argument("--resume", nargs="?", const=True, metavar="DIR",
                     help="continue the grid in DIR (or --out), its runs to more rounds with -r N "
                          "(or other settings a resume may change, --set eval_every=5)")
    add_pool_flags(cmp)
    cmp.set_defaults(func=command)
    return cmp


def command(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet import api
    from fedhet.runs import load_grid, sweep

    flags = {k: getattr(args, k) for k in RUN_FLAGS
             if k not in ("device", "executor", "workers")  # where runs compute: `overrides`
             and getattr(args, k, None) not in (None, "")}
    if args.resume:
        return extend_grid(args, flags)
    changes = sweep.changes(flags, args.set, args.sweep, title=not args.config)
    if not args.config and not changes:
        raise FedhetError(
            "compare needs a grid: --config GRID.toml (or a shipped grid's name, e.g. "
            "grid-digits), or settings and sweeps, e.g. -a fedavg,fedprox -d digits "
            "--sweep lr=0.01,0.1 --sweep seed=0,1,2"
        )
    config = resolve_config(args.config, "grid file") if args.config else None
    if args.dry_run:
        print("\n".join(sweep.dry_run(load_grid(config, changes or None))))
        return 0
    name = Path(args.config).name.removesuffix(".toml") if args.config else sweep.dir_name(changes)
    out = Path(args.out) if args.out else api.new_run_dir(name)
    argv = [*args.argv] + ([] if args.out else ["--out", str(out)])
    if not args.out:
        print(f"grid directory: {out}", file=sys.stderr, flush=True)
    rows = api.compare(base=changes.fixed, sweeps=changes.sweeps, sources=changes.sources,
                       title=changes.title, config=config, out=out, jobs=args.jobs,
                       force=args.force, tensorboard=args.tensorboard, runtime=overrides(args),
                       hint="fedhet " + shlex.join(argv), stack_runs=stack_runs(args),
                       cluster=cluster(args))
    print(f"{len(rows)} runs; results in {out}/results.csv and {out}/summary.md")
    return 0


def extend_grid(args: argparse.Namespace, flags: dict[str, Any]) -> int:
    """`compare --resume [DIR]`: the grid in DIR (or --out) again, every run continued with
    what a resume may change (`-r N`, `--set eval_every=...`), as `run --resume` does one."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet import api
    from fedhet.engine import RESUMABLE
    from fedhet.rundir import resume_target
    from fedhet.runs import sweep

    out = resume_target(args.resume, args.out, args.force)
    if args.config or args.sweep:
        raise FedhetError("--resume continues the grid DIR/grid.toml holds: leave out "
                          f"{'--config' if args.config else '--sweep'} (or run a new grid)")
    if not (out / "grid.toml").is_file():
        raise FedhetError(f"--resume {out}: no grid.toml there, so it is no grid directory "
                          "`fedhet compare` made; give the --out of the grid to continue")
    changes = sweep.changes(flags, args.set, [], title=False)
    other = sorted(k for k in changes.fixed if k not in RESUMABLE)
    if other:
        raise FedhetError(f"--resume {out}: a resume may change only {', '.join(sorted(RESUMABLE))}; "
                          f"got {', '.join(other)} (run a new grid with --out for other settings)")
    argv = [*args.argv] + ([] if args.out or isinstance(args.resume, str) else ["--out", str(out)])
    rows = api.compare(base=changes.fixed, sources=changes.sources, config=out / "grid.toml",
                       out=out, jobs=args.jobs, tensorboard=args.tensorboard,
                       runtime=overrides(args), hint="fedhet " + shlex.join(argv), extend=True,
                       stack_runs=stack_runs(args), cluster=cluster(args))
    print(f"{len(rows)} runs; results in {out}/results.csv and {out}/summary.md")
    return 0
