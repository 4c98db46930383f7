"""`fedhet` command line: parse, validate, hand over to the layers below. Nothing else.

One module per verb, each with its parser (only its own flags) and its command: `run`,
`compare`, `reproduce` (a paper's preset), `campaign` (`campaign run|plan`: the papers' tables
at their own scale), `report`, `paper_scale`, `docs`, `listing` (`fedhet list`), `config`
(`config show`), `partition`, `deploy`, `demo`; `common` holds what several share (the parser
class, flag groups, the run's settings). This module builds the parser from the verbs and runs
one: `main`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedhet import plugins
from fedhet.cli import (
    campaign,
    compare,
    config,
    demo,
    deploy,
    docs,
    listing,
    paper_scale,
    partition,
    report,
    reproduce,
    run,
)
from fedhet.cli.common import EXIT_DIVERGED, EXIT_ERROR, DivergedRunError, Parser, add_plugin_flag
from fedhet.errors import FedhetDeprecationWarning, FedhetError, debugging

VERBS = (run, compare, reproduce, campaign, report, paper_scale, docs, listing, config, partition,
         deploy, demo)
"""The verbs' modules, in the order `fedhet --help` lists them; each has `add(subparsers)`."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fedhet", description="Federated learning on non-IID data.")
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="torch threads in this process (default: $FEDHET_THREADS or 1; the papers' small "
        "models and batches run fastest on one thread, and several threads per process slow "
        "parallel runs down badly)",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for verb in VERBS:
        verb.add(sub)
    add_plugin_flag(parser, top=True)
    for p in leaf_parsers(sub):
        add_plugin_flag(p)
        p.set_defaults(leaf=p)  # whose flags an unknown argument is checked against
    return parser


def leaf_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    """Every command's parser, nested ones (`config show`, `campaign run`) included."""
    out = []
    for parser in dict.fromkeys(sub.choices.values()):
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        out += [leaf for n in nested for leaf in leaf_parsers(n)] if nested else [parser]
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line parsed; an argument its command does not take is one error line (the
    command's own, for a flag that belongs to another command)."""
    args, extras = build_parser().parse_known_args(argv)
    if extras:
        leaf = getattr(args, "leaf", None)
        if not isinstance(leaf, Parser):
            raise FedhetError(f"unrecognized arguments: {' '.join(extras)} (see `fedhet --help`)")
        raise leaf.unknown(extras)
    return args


def _load_plugins(args: argparse.Namespace) -> None:
    """The installed packages' entry points, `$FEDHET_PLUGINS`, then each `--plugin`, with the
    working directory importable (`-m mymodels.nets:tiny` from the folder that holds it)."""
    plugins.working_directory_importable()
    plugins.startup([*args.plugins_first, *getattr(args, "plugins", [])])


def _set_threads(threads: int | None) -> None:
    if threads is None:
        raw = os.environ.get("FEDHET_THREADS", "1")
        if not raw.isdigit():
            raise FedhetError(f"FEDHET_THREADS must be a positive integer, got {raw!r}")
        threads = int(raw)
    if threads < 1:
        raise FedhetError(f"--threads must be ≥ 1, got {threads}")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # after OMP_NUM_THREADS is set: torch reads it when first imported
    import torch

    torch.set_num_threads(threads)


def _os_error(e: OSError) -> str:
    where = f" ({e.filename})" if e.filename else ""
    return (f"{e.strerror or e}{where}; check that the path is a writable directory with free "
            "space, or choose another --out")


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. An old spelling (`reproduce all`, `--batch-runs`,
    `executor = "batched"`) runs as its new one (`campaign run`, `--stack-runs`, `stacked`) and
    says so in one line each: after the command, or at the end of its error line."""
    argv, note = campaign.old_spelling(list(sys.argv[1:] if argv is None else argv))
    notes = [note] if note else []
    with old_spellings(notes):
        return _main(argv, notes)


@contextlib.contextmanager
def old_spellings(notes: list[str]) -> Iterator[None]:
    """Each old spelling's warning (`FedhetDeprecationWarning`) while the command runs, added
    to `notes` once; every other warning is shown as Python shows it."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", FedhetDeprecationWarning)
        show = warnings.showwarning

        def collect(message: Any, category: type[Warning], *rest: Any, **kw: Any) -> None:
            if not issubclass(category, FedhetDeprecationWarning):
                show(message, category, *rest, **kw)
            elif str(message) not in notes:
                notes.append(str(message))

        warnings.showwarning = collect
        yield


def _main(argv: list[str], notes: list[str]) -> int:
    args = None
    try:
        args = parse(argv)
        args.argv = argv
        if args.debug:  # grid workers and deploy nodes inherit it
            os.environ["FEDHET_DEBUG"] = "1"
        _set_threads(args.threads)
        with plugins.command_line():
            _load_plugins(args)
            code = args.func(args)
    except DivergedRunError as e:
        _say(f"error: {e}")
        return EXIT_DIVERGED
    except FedhetError as e:
        if debugging():
            traceback.print_exception(e, file=sys.stderr)
        _say(f"error: {e}" + "".join(f"; note: {n}" for n in notes))
        return EXIT_ERROR
    except BrokenPipeError:  # `fedhet list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the file system said no: unwritable, not a directory, disk full
        _say(f"error: {_os_error(e)}")
        return EXIT_ERROR
    except KeyboardInterrupt as e:
        if not getattr(e, "reported", False):  # compare/reproduce print their own line
            _say(_interrupted(args))
        return 130
    for n in notes:
        _say(f"note: {n}")
    return code


def _say(line: str) -> None:
    """`line` and its newline to stderr in one write: a library's thread writing its own log to
    the same stream (Ray's) cannot land between the two, as it can between `print`'s."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _interrupted(args: argparse.Namespace | None) -> str:
    """The Ctrl-C line: how to continue, naming the run directory (`run`), or that nothing was
    saved yet."""
    out = getattr(args, "run_dir", None)
    if args is None or out is None:
        return "interrupted"
    if not (Path(out) / "config.json").is_file():
        return f"interrupted before the run saved anything in {out}"
    return f"interrupted; continue with `{args.resume_hint}`"


__all__ = ["EXIT_DIVERGED", "EXIT_ERROR", "DivergedRunError", "build_parser", "main"]
