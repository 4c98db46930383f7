"""`fedhet run`: one experiment (`fedhet.run`, or `fedhet.resume` with `--resume`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from fedhet.cli.common import DivergedRunError, add_run_flags, run_values
from fedhet.errors import FedhetError, quiet


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    run = sub.add_parser("run", help="run one experiment")
    add_run_flags(run)
    run.add_argument("--out", "-o", help="run directory for config, metrics and checkpoints "
                     "(default: a new runs/<algorithm>-<dataset>-<time>/)")
    run.add_argument("--resume", nargs="?", const=True, metavar="DIR",
                     help="continue the run in DIR (or --out) from its last checkpoint")
    run.add_argument("--force", action="store_true", help="replace a non-empty --out")
    run.add_argument("--quiet", "-q", action="store_true",
                     help="print nothing but errors and warnings (the results are in --out)")
    run.add_argument("--tensorboard", action="store_true",
                     help="also log metrics for TensorBoard into DIR/tensorboard (needs tensorboard)")
    run.set_defaults(func=command)
    return run


def command(args: argparse.Namespace) -> int:
    """`fedhet run`: `fedhet.run` (or `fedhet.resume`) with the command line's settings."""
    out, values = _target(args)
    args.resume_hint = f"fedhet run --resume {shlex.quote(str(out))}"
    args.run_dir = out
    summary = _execute(args, out, values)
    if summary.get("status") == "diverged":
        d = summary["diverged"]
        client = f", client {d['client']}" if d.get("client") is not None else ""
        raise DivergedRunError(
            f"the run diverged in round {d['round']}{client} (non-finite {d['what']}); it is "
            f"marked diverged in {out / 'summary.json'}: {divergence_advice(d['round'], values)}"
        )
    if args.quiet:
        return 0
    print(
        f"{summary['algorithm']} on {summary['dataset']}/{summary['partition']}: final accuracy "
        f"{summary['final_accuracy']:.4f}, best {summary['best_accuracy']:.4f} "
        f"(round {summary['best_round']}), {summary['total_time_s']:.1f} s; results in {out}"
    )
    return 0


def _target(args: argparse.Namespace) -> tuple[Path, dict[str, Any] | None]:
    """The run directory and the settings: a resume's (None: the saved ones), or a new run's,
    checked before a directory is named."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet import api
    from fedhet.rundir import resume_target

    if args.resume:
        return resume_target(args.resume, args.out, args.force), run_values(args) or None
    values = run_values(args)
    if args.out:
        return Path(args.out), values
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import build

    build(values)  # bad settings fail before a directory is named
    out = api.new_run_dir(api.default_name(values))
    if not args.quiet:
        print(f"run directory: {out}", file=sys.stderr, flush=True)
    return out, values


def _execute(args: argparse.Namespace, out: Path, values: dict[str, Any] | None) -> dict[str, Any]:
    """Run (or resume) with the callbacks the terminal or log asks for; the run's summary."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet import api
    from fedhet.engine import UserCodeFailed

    show = sys.stderr.isatty() and not args.quiet
    logger = None
    if args.tensorboard:
        # optional extra: fedhet[tensorboard]
        from fedhet.runs import TensorBoardLogger, require_tensorboard

        require_tensorboard()
    try:
        if args.tensorboard:
            logger = TensorBoardLogger(out)
        callbacks: list[Any] = [logger] if logger is not None else []
        if not sys.stdout.isatty() and not args.quiet:
            # a log file or a batch job: a line every few rounds or seconds, on stdout (lazy, as
            # every command's imports)
            from fedhet.runs import RoundLines

            callbacks.append(RoundLines(total_rounds(values, out, bool(args.resume)), sys.stdout))
        try:
            log = quiet if args.quiet else print  # -q: nothing but errors and warnings
            if args.resume:
                result = api.resume(out, settings=values, progress=show, callbacks=callbacks,
                                    log=log)
            else:
                result = api.run(settings=values, out=out, force=args.force, progress=show,
                                 callbacks=callbacks, log=log)
        except UserCodeFailed as e:
            raise FedhetError(
                f"{e}; the run is marked failed in {out / 'summary.json'} and the rounds before "
                f"it are kept: fix it, then `{args.resume_hint}` continues (--debug shows the "
                "traceback)"
            ) from e
        return result.summary
    finally:
        if logger is not None:
            logger.close()


def total_rounds(values: dict[str, Any] | None, out: Path, resume: bool) -> int:
    """The rounds a run will end at, for its progress lines (a guess when the settings are bad:
    the run then fails before its first line)."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import RunConfig
    from fedhet.rundir import read_config

    rounds = (values or {}).get("rounds")
    if rounds is None and resume:
        try:
            rounds = read_config(out).get("rounds")
        except FedhetError:
            rounds = None
    try:
        return max(1, int(rounds if rounds is not None else RunConfig.rounds))
    except (TypeError, ValueError):
        return RunConfig.rounds


def divergence_advice(round: int, values: dict[str, Any] | None) -> str:
    """What to check after a divergence: the learning rate, and in round 1 on the user's own
    file, the data as well (unscaled features, an id or index column, the wrong label column)."""
    advice = "lower lr or check the settings"
    if round <= 1 and Path(str((values or {}).get("dataset", ""))).suffix in (".csv", ".npz", ".npy"):
        advice += (
            "; in round 1 on your own file, check the data too: features on very different "
            "scales (standardise them), an id or row-index column read as a feature, or the "
            "label column (fedhet docs data)"
        )
    return advice
