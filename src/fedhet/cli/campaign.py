"""`fedhet campaign run|plan`: the papers' tables at their own scale (`fedhet.papers.campaign`).

- `campaign run --budget MINUTES`: one sitting (the runs it has time for, recorded under
  `--results`); in a checkout it regenerates docs/paper-scale.md after;
- `campaign plan`: every cell, what is done, in progress and left, where and how long.

`fedhet reproduce all` and `fedhet reproduce plan`, the earlier spellings, still work in this
release: `old_spelling` turns them into these, and the command says so in one line (docs/cli.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedhet.cli.common import (
    SETTING_FLAGS,
    Parser,
    add_data_dir_flag,
    add_device_flags,
    add_stack_runs_flag,
    names,
)
from fedhet.errors import FedhetError

OLD = {"all": "run", "plan": "plan"}
"""`fedhet reproduce WORD` → `fedhet campaign VERB`, the spellings of one more release."""

TOP_VALUE_FLAGS = ("--threads", "--plugin")
"""The options before the command that take a value (`fedhet --threads 2 reproduce all`)."""

ELSEWHERE = (*[f for f in SETTING_FLAGS if f != "--data-dir"], "--executor", "--workers", "--jobs",
             "--only", "--protocol", "--baselines", "--quiet", "--force", "--tensorboard",
             "--cluster", "--ray-address", "--cpus-per-run", "--gpus-per-run", "--precision")
"""Options of a paper's preset or of `compare` that the campaign's fixed tables do not take."""


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    camp = sub.add_parser("campaign", help="the papers' tables at their own scale: a sitting "
                          "(run) or what is done and left (plan); docs/paper-scale.md")
    verbs = camp.add_subparsers(dest="campaign_command", required=True, metavar="{run,plan}",
                                parser_class=Parser)
    run = verbs.add_parser("run", help="one sitting: the runs this budget has time for, headline "
                           "cells first, recorded under --results/campaign")
    run.add_argument("--budget", type=float, metavar="MINUTES",
                     help="minutes of this sitting (it stops before they end; run again to continue)")
    run.add_argument("--cores", type=int, metavar="N",
                     help="runs at once on the CPU, one thread each (default 1)")
    run.add_argument("--nice", type=int, default=10, metavar="N",
                     help="the runs' scheduling priority (default 10: low)")
    _add_shared(run)
    add_data_dir_flag(run)
    run.set_defaults(func=run_command)
    plan = verbs.add_parser("plan", help="every cell: done, in progress, left, where, how long")
    _add_shared(plan)
    plan.set_defaults(func=plan_command)
    for p in (run, plan):
        _refuse_elsewhere(p)
    assert isinstance(plan, Parser)
    plan.refuse(("--budget", "--cores", "--nice", "--data-dir"),
                "{flag}: an option of a sitting (`fedhet campaign run`); the plan runs nothing")
    return camp


def _add_shared(p: argparse.ArgumentParser) -> None:
    """The options of both verbs: which tables, at what scale, where, and where they are kept."""
    p.add_argument("--tables", metavar="TABLES", help="only these tables (comma-separated; "
                   "`fedhet campaign plan` lists them)")
    p.add_argument("--scale", choices=("smoke", "small", "paper"),
                   help="the presets' size (default paper)")
    add_device_flags(p, where_only=True)
    add_stack_runs_flag(p)
    p.add_argument("--cache", metavar="DIR", help="the run directories and their checkpoints "
                   "(default $FEDHET_CAMPAIGN_CACHE or ~/.cache/fedhet/campaign)")
    p.add_argument("--results", metavar="DIR", help="where the records and the result CSVs go "
                   "(default results)")


def _refuse_elsewhere(p: argparse.ArgumentParser) -> None:
    assert isinstance(p, Parser)
    verb = p.prog.split()[-1]
    p.refuse(ELSEWHERE, f"{{flag}}: not an option of `fedhet campaign {verb}`, whose runs are the "
                        "papers' tables with fixed settings; give it to one paper's preset "
                        "(`fedhet reproduce PAPER ...`) or to `fedhet compare`")
    p.refuse(("--setup",), "--setup goes with one paper's preset (`fedhet reproduce PAPER "
                           "--setup NAME`); the campaign runs the papers' tables, which have one setup")
    p.refuse(("--out",), "--out: the campaign's run directories live in its cache (--cache, default "
                         "~/.cache/fedhet/campaign) and its records in --results (default results)")


def _tables(args: argparse.Namespace) -> tuple[str, ...] | None:
    return (names(args.tables, "--tables", "fednnnn-mnist,fedsr-mnist")
            if args.tables is not None else None)


def plan_command(args: argparse.Namespace) -> int:
    """`fedhet campaign plan`: the plan as a table (`fedhet.papers.campaign.plan`)."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.campaign.plan import print_plan

    print_plan(args.scale or "paper", args.device or "cpu", Path(args.results or "results"),
               Path(args.cache) if args.cache else None, _tables(args), args.stack_runs or 8,
               sys.stdout)
    return 0


def run_command(args: argparse.Namespace) -> int:
    """`fedhet campaign run --budget MINUTES`: one sitting of the campaign."""
    if args.budget is None:
        raise FedhetError("`fedhet campaign run` needs --budget MINUTES (the time of this sitting; "
                          "`fedhet campaign plan` shows what is left)")
    tables = _tables(args)
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.campaign import run_campaign

    results = Path(args.results or "results")
    try:
        run_campaign(args.scale or "paper", args.device or "cpu", args.budget, results,
                     Path(args.cache) if args.cache else None,
                     1 if args.cores is None else args.cores, tables, args.stack_runs or 8,
                     args.data_dir, args.nice)
    finally:
        follow_page(results, args.scale or "paper")
    return 0


def follow_page(results: Path, scale: str) -> None:
    """The paper-scale page follows the records: a sitting in a checkout regenerates it."""
    page = results.resolve().parent / "docs" / "paper-scale.md"
    if scale != "paper" or not page.is_file() or not (results / "campaign").is_dir():
        return
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.paper_scale import write_page

    print(f"page: {write_page(results, page)} (regenerated from the records)", file=sys.stderr)


def old_spelling(argv: list[str]) -> tuple[list[str], str]:
    """`reproduce all ...` → `campaign run ...`, `reproduce plan ...` → `campaign plan ...`,
    with the line that says so ('' for any other command line)."""
    i = _command_index(argv)
    if i is None or argv[i] != "reproduce":
        return argv, ""
    j = _first_positional(argv, i + 1)
    if j is None or argv[j] not in OLD:
        return argv, ""
    verb = OLD[argv[j]]
    note = (f"`fedhet reproduce {argv[j]}` is now `fedhet campaign {verb}`; the old spelling "
            "goes in the next release (docs/cli.md)")
    return [*argv[:i], "campaign", verb, *argv[i + 1:j], *argv[j + 1:]], note


def _command_index(argv: list[str]) -> int | None:
    """Where the command is in `argv`: the first word that is no option nor an option's value."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):
            return i
        i += 2 if token in TOP_VALUE_FLAGS else 1
    return None


def _first_positional(argv: list[str], start: int) -> int | None:
    """The first word after `start` that is no option (`reproduce --scale paper all`): the
    old `reproduce` options that took a value are skipped with their value."""
    switches = {"--quiet", "-q", "--force", "--tensorboard", "--debug", "-h", "--help"}
    i = start
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):
            return i
        i += 1 if token in switches or "=" in token else 2
    return None
