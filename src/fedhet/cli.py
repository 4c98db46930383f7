"""`fedhet` command line: parse, validate, hand over to the layers below. Nothing else."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

from fedhet import plugins
from fedhet.configs import is_grid, shipped
from fedhet.configs import resolve as resolve_config
from fedhet.errors import FedhetError, debugging, quiet
from fedhet.registry import did_you_mean

EXIT_ERROR = 2
"""Bad input or an unusable environment."""
EXIT_DIVERGED = 3
"""The run stopped on non-finite numbers (summary.json says `status: diverged`)."""


class DivergedRunError(FedhetError):
    """A run that stopped on non-finite numbers; exits with `EXIT_DIVERGED`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:  # `fedhet rnu`, `--device cdua`: the nearest choice
            choices = [c.strip().strip("'") for c in m.group(2).split(",")]
            message += did_you_mean(m.group(1), choices)
        raise FedhetError(f"{message} (see `{self.prog} --help`)")


def _read_toml(given: str) -> dict[str, Any]:
    """A run file: a path, or the name of a shipped one (`fedhet.configs.resolve`)."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import read_toml_file

    _, doc = read_toml_file(resolve_config(given), "config file")
    grid_keys = sorted({"base", "axes", "variant"} & set(doc))
    if grid_keys:
        raise FedhetError(
            f"config file {given} is a grid ([{grid_keys[0]}]): run it with "
            f"`fedhet compare --config {given}`"
        )
    return doc


def _run_layers(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """The run's settings as `(source, {path: value})` layers, later wins: the `--config` file,
    then each flag, then each `--set` (`fedhet.api.setting_layers`, as a Python caller's). The
    source is what `fedhet config show` prints."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.api import RUN_FLAGS, setting_layers

    config = (args.config, _read_toml(args.config)) if args.config else None
    flags = {k: getattr(args, k, None) for k in RUN_FLAGS}
    return setting_layers(flags, list(args.set), config, where="command line",
                          flag_source=lambda k: f"flag --{k.replace('_', '-')}")


def _run_values(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings as config paths (`_run_layers` merged, later wins)."""
    values: dict[str, Any] = {}
    for _, layer in _run_layers(args):
        values.update(layer)
    return values


def _total_rounds(values: dict[str, Any] | None, out: Path, resume: bool) -> int:
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


def cmd_run(args: argparse.Namespace) -> int:
    """`fedhet run`: `fedhet.run` (or `fedhet.resume`) with the command line's settings."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet import api
    from fedhet.engine import UserCodeFailed
    from fedhet.rundir import resume_target

    if args.resume:
        out, values = resume_target(args.resume, args.out, args.force), _run_values(args) or None
    else:
        values = _run_values(args)
        if args.out:
            out = Path(args.out)
        else:
            # lazy: a command imports torch only when it runs (fast --help and flag errors)
            from fedhet.engine import build

            build(values)  # bad settings fail before a directory is named
            out = api.new_run_dir(api.default_name(values))
            if not args.quiet:
                print(f"run directory: {out}", file=sys.stderr, flush=True)
    args.resume_hint = f"fedhet run --resume {shlex.quote(str(out))}"
    args.run_dir = out
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

            callbacks.append(RoundLines(_total_rounds(values, out, bool(args.resume)), sys.stdout))
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
        summary = result.summary
    finally:
        if logger is not None:
            logger.close()
    if summary.get("status") == "diverged":
        d = summary["diverged"]
        client = f", client {d['client']}" if d.get("client") is not None else ""
        raise DivergedRunError(
            f"the run diverged in round {d['round']}{client} (non-finite {d['what']}); it is "
            f"marked diverged in {out / 'summary.json'}: {_divergence_advice(d['round'], values)}"
        )
    if args.quiet:
        return 0
    print(
        f"{summary['algorithm']} on {summary['dataset']}/{summary['partition']}: final accuracy "
        f"{summary['final_accuracy']:.4f}, best {summary['best_accuracy']:.4f} "
        f"(round {summary['best_round']}), {summary['total_time_s']:.1f} s; results in {out}"
    )
    return 0


def _divergence_advice(round: int, values: dict[str, Any]) -> str:
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


def cmd_compare(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet import api
    from fedhet.runs import load_grid, sweep

    flags = {k: getattr(args, k) for k in api.RUN_FLAGS
             if k not in ("device", "executor", "workers")  # where runs compute: `_overrides`
             and getattr(args, k, None) not in (None, "")}
    if args.resume:
        return _extend_grid(args, flags)
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
                       force=args.force, tensorboard=args.tensorboard, runtime=_overrides(args),
                       hint="fedhet " + shlex.join(argv), **_batch_runs(args), **_cluster(args))
    print(f"{len(rows)} runs; results in {out}/results.csv and {out}/summary.md")
    return 0


def _extend_grid(args: argparse.Namespace, flags: dict[str, Any]) -> int:
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
                       runtime=_overrides(args), hint="fedhet " + shlex.join(argv), extend=True,
                       **_batch_runs(args), **_cluster(args))
    print(f"{len(rows)} runs; results in {out}/results.csv and {out}/summary.md")
    return 0


SETTING_FLAGS = ("algorithm", "dataset", "partition", "model", "clients", "rounds", "seed",
                 "data_dir", "config", "set")


def cmd_reproduce(args: argparse.Namespace) -> int:
    if args.paper in ("all", "plan"):
        return _reproduce_all(args)
    given = [f for f, v in (("--budget", args.budget), ("--tables", args.tables),
                            ("--results", args.results), ("--cores", args.cores),
                            ("--cache", args.cache), ("--nice", args.nice if args.nice != 10 else None))
             if v is not None]
    if given:
        raise FedhetError(f"{', '.join(given)} go with `fedhet reproduce all` (the campaign) and "
                          "`fedhet reproduce plan`")
    if args.setup and args.protocol:
        raise FedhetError("--setup chooses a preset's setup; --protocol runs on your settings "
                          "(give them with --set, e.g. --set dataset.normalize=false)")
    if args.protocol:
        return _reproduce_protocol(args)
    given = [f"--{k.replace('_', '-')}" for k in SETTING_FLAGS if getattr(args, k) not in (None, [])]
    if given or args.baselines is not None:
        raise FedhetError(
            f"{', '.join(given or ['--baselines'])}: a preset fixes its own settings; run settings "
            "go with --protocol (--device, --executor and --workers choose where a preset runs)"
        )
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.base import PRESETS
    from fedhet.papers.reproduce import default_out, reproduce

    args.paper = PRESETS.canonical(args.paper)  # `FedSR` is `fedsr`
    scale = args.scale or "smoke"
    out = Path(args.out) if args.out else default_out(args.paper, scale, args.setup)
    only = _names(args.only, "--only", "mnist,mnist-even-odd") if args.only is not None else None
    reproduce(args.paper, scale, out, args.jobs, args.force, args.tensorboard,
              overrides=_overrides(args), only=only, setup=args.setup, **_batch_runs(args),
              **_cluster(args))
    print(f"results in {out}/results.csv, {out}/summary.md and {out}/report.md")
    return 0


def _reproduce_all(args: argparse.Namespace) -> int:
    """`fedhet reproduce all --budget MINUTES`: one sitting of the campaign (papers/campaign)."""
    plan = args.paper == "plan"
    if args.budget is None and not plan:
        raise FedhetError("reproduce all needs --budget MINUTES (the time of this sitting; "
                          "`fedhet reproduce plan` shows what is left)")
    if args.setup:
        raise FedhetError("--setup goes with one paper's preset (fedveca, bherd); the campaign runs "
                          "the papers' tables, which have one setup")
    ignored = [flag for flag, dest in CAMPAIGN_IGNORES if getattr(args, dest) not in (None, False, [])]
    if plan and args.budget is not None:
        ignored.append("--budget")
    if ignored:
        raise FedhetError(
            f"{', '.join(ignored)}: {'not an option' if len(ignored) == 1 else 'not options'} of "
            f"`reproduce {args.paper}`, whose runs are the papers' tables with fixed settings (it "
            "takes --budget, --cores, --tables, --scale, --device, --batch-runs, --cache, "
            "--data-dir and --results); give them to one paper's preset (`fedhet reproduce fedsr "
            "...`) or to `fedhet compare`"
        )
    if args.out is not None:
        raise FedhetError("--out: the campaign's run directories live in its cache (--cache, default "
                          "~/.cache/fedhet/campaign) and its records in --results (default results)")
    tables = (_names(args.tables, "--tables", "fednnnn-mnist,fedsr-mnist")
              if args.tables is not None else None)
    cache = Path(args.cache) if args.cache else None
    if plan:
        # lazy: a command imports torch only when it runs (fast --help and flag errors)
        from fedhet.papers.campaign.plan import print_plan

        print_plan(args.scale or "paper", args.device or "cpu", Path(args.results or "results"), cache,
                   tables, args.batch_runs or 8, sys.stdout)
        return 0
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.campaign import run_campaign

    results = Path(args.results or "results")
    try:
        run_campaign(args.scale or "paper", args.device or "cpu", args.budget, results, cache,
                     1 if args.cores is None else args.cores, tables, args.batch_runs or 8,
                     args.data_dir, args.nice)
    finally:
        _follow_page(results, args.scale or "paper")
    return 0


def _follow_page(results: Path, scale: str) -> None:
    """The paper-scale page follows the records: a sitting in a checkout regenerates it."""
    page = results.resolve().parent / "docs" / "paper-scale.md"
    if scale != "paper" or not page.is_file() or not (results / "campaign").is_dir():
        return
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.paper_scale import write_page

    print(f"page: {write_page(results, page)} (regenerated from the records)", file=sys.stderr)


CAMPAIGN_IGNORES = (
    ("--algorithm", "algorithm"), ("--dataset", "dataset"), ("--partition", "partition"),
    ("--model", "model"), ("--clients", "clients"), ("--rounds", "rounds"), ("--seed", "seed"),
    ("--config", "config"), ("--set", "set"), ("--executor", "executor"),
    ("--workers", "workers"), ("--jobs", "jobs"), ("--only", "only"),
    ("--protocol", "protocol"), ("--baselines", "baselines"), ("--quiet", "quiet"),
    ("--force", "force"), ("--tensorboard", "tensorboard"), ("--cluster", "cluster"),
    ("--ray-address", "ray_address"), ("--cpus-per-run", "cpus_per_run"),
    ("--gpus-per-run", "gpus_per_run"),
)
"""`reproduce` options that `reproduce all` (the campaign) does not take: each is refused."""


def _names(text: str, flag: str, example: str) -> tuple[str, ...]:
    """A comma-separated list of names; an empty one (`--tables ""`) is one line, not "all"."""
    names = tuple(t.strip() for t in text.split(","))
    if not all(names):
        raise FedhetError(f"{flag} {text!r} has an empty name; give comma-separated names, e.g. "
                          f"{flag} {example}")
    return names


def _batch_runs(args: argparse.Namespace) -> dict[str, int]:
    """`--batch-runs` when given; else the runner's default (`DEFAULT_BATCH_RUNS`)."""
    return {"batch_runs": args.batch_runs} if args.batch_runs else {}


def _reproduce_protocol(args: argparse.Namespace) -> int:
    preset_only = [
        flag for flag in ("--scale", "--only", "--jobs", "--batch-runs", "--tensorboard",
                          *CLUSTER_FLAGS)
        if getattr(args, flag[2:].replace("-", "_"), None) not in (None, False)
    ]
    if preset_only:
        given = " ".join(f if getattr(args, f[2:].replace("-", "_")) is True
                         else f"{f} {getattr(args, f[2:].replace('-', '_'))}" for f in preset_only)
        raise FedhetError(
            f"{', '.join(preset_only)}: a preset's options; --protocol runs the paper's methods on "
            f"your settings instead. Either drop --protocol to run the preset (`fedhet reproduce "
            f"{args.paper} {given}`), or drop {', '.join(preset_only)} and set the runs' size with "
            f"the run flags (e.g. `fedhet reproduce {args.paper} --protocol {args.protocol} -r 20`)"
        )
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import parse
    from fedhet.papers.base import protocol

    proto = protocol(args.paper, args.protocol)
    settings = {**parse(proto.defaults, f"{args.paper} {args.protocol} defaults"), **_run_values(args)}
    baselines = list(_names(args.baselines, "--baselines", "fedavg,fednova")) \
        if args.baselines is not None else None
    show = sys.stderr.isatty() and not args.quiet
    out = Path(args.out or f"runs/{args.paper}-{args.protocol}")
    lines = not sys.stdout.isatty() and not args.quiet  # a log file: a line now and then
    for line in proto.run(settings, out, baselines=baselines, force=args.force, progress=show,
                          lines=lines):
        print(line)
    return 0


def cmd_paper_scale(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.papers.paper_scale import write_page

    print(f"page: {write_page(Path(args.results), Path(args.out))}")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    """`fedhet docs [TOPIC] [--path]`: the docs shipped with the package (fedhet.userdocs)."""
    # lazy, as every command's imports (fast --help)
    from fedhet import userdocs

    if not args.topic:
        print(userdocs.listing())
        return 0
    path = userdocs.doc_path(args.topic)
    print(path if args.path else path.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors); the papers
    # register their report figures (`fedhet.reports.figures`) when imported
    from fedhet import papers  # noqa: F401
    from fedhet.reports import write_report

    page = write_report(Path(args.dir), Path(args.out) if args.out else None)
    print(f"report: {page}")
    if args.screenshot:
        from fedhet.reports import screenshot_page as screenshot  # lazy, as above

        print(f"screenshot: {screenshot(page, Path(args.screenshot))}")
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """A time limit: a number of seconds > 0 (`--timeout 0` would stop a run before it starts)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _workers(text: str) -> str | int:
    """`--workers`: `auto` or a whole number ≥ 1 (0 is `auto` only in settings files)."""
    if text.strip().lower() == "auto":
        return "auto"
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number ≥ 1, got {text!r}")
    return int(text)


def cmd_list(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import ENGINE_FIELDS, FIELD_DOCS, REGISTRIES, engine_defaults
    from fedhet.metrics import METRICS

    defaults = engine_defaults()
    print("settings (--set KEY=VALUE, or KEY = VALUE in a run file; default, meaning):")
    for key in ENGINE_FIELDS:
        if key in REGISTRIES:
            continue
        shown = f"{key}={_shown(defaults[key])}"
        print(f"  {shown:<26} {FIELD_DOCS.get(key, '')}".rstrip())
    for kind in ("algorithm", "dataset", "partition", "model"):
        registry = REGISTRIES[kind]
        print(f"{kind}s (--{kind}, default {defaults[kind]}; parameters: --set {kind}.NAME=VALUE):")
        for entry in registry:
            fields = dataclasses.fields(entry.params)
            old = {new: name for name, new in getattr(entry.params, "ALIASES", {}).items()}
            ps = ", ".join(
                f"{f.name}={_default(f)}" + (f" (formerly {old[f.name]})" if f.name in old else "")
                for f in fields
            )
            origin = "" if entry.source == "fedhet" else f" [{entry.source}]"
            print(f"  {entry.name:<16} {entry.doc}{origin}")
            if ps:
                print(f"  {'':<16} params: {ps}")
    print("metrics (--set metrics=NAME,...; registered with fedhet.register_metric, or any "
          "scikit-learn scorer name: f1_macro, balanced_accuracy, roc_auc_ovr, ...):")
    for entry in METRICS:
        origin = "" if entry.source == "fedhet" else f" [{entry.source}]"
        print(f"  {entry.name:<16} {entry.doc}{origin}")
    files = shipped()
    print("shipped settings files (--config NAME):")
    print(f"  run files: {', '.join(n for n, p in files.items() if not is_grid(p))}")
    print(f"  grids (fedhet compare): {', '.join(n for n, p in files.items() if is_grid(p))}")
    return 0


def _shown(value: Any) -> str:
    return "()" if value == () else str(value)


def cmd_config_show(args: argparse.Namespace) -> int:
    """`fedhet config show`: every setting `run` would use with these flags, its value and
    where it came from (default, file, flag); nothing is loaded or written."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import parse
    from fedhet.rundir import resume_target
    from fedhet.runs import render_settings as render
    from fedhet.runs import resume_settings
    from fedhet.runs import settings_json as as_json
    from fedhet.runs import settings_sections as sections

    layers = _run_layers(args)
    if args.resume:
        # what `run --resume` would refuse is refused here, in its words
        target = resume_target(args.resume, args.out, args.force)
        _, saved, _ = resume_settings(target, _run_values(args) or None,
                                      lambda m: print(m, file=sys.stderr))
        layers = [(f"file {target / 'config.json'}", parse(saved, "config.json")),
                  *[(src, v) for src, v in layers if not src.startswith("file ")]]
    parts = sections(layers)
    print(as_json(parts) if args.json else render(parts))
    return 0


def _default(f: Any) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "?"


def cmd_partition(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.reports import describe_partition

    values = _run_values(args)
    describe_partition(values, heatmap=args.heatmap, indices=args.save_indices)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.runs import run_demo

    run_demo(Path(args.out), rounds=args.rounds, force=args.force)
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    # needs the optional extra fedhet[flower]
    from fedhet.deploy import require_flower

    require_flower()
    # needs the optional extra fedhet[flower]
    from fedhet.deploy.command import check_timeouts, deploy_app, deploy_local

    if not args.out:
        raise FedhetError("--out DIR is required (where the server writes metrics and checkpoints)")
    check_timeouts(("round-timeout", args.round_timeout), ("node-wait", args.node_wait))
    values, out = _run_values(args), Path(args.out)
    if args.mode == "app":
        deploy_app(values, out, Path(args.app_dir), args.round_timeout, args.node_wait, args.force,
                   auth=args.auth)
        return 0
    keep = Path(args.keep_logs) if args.keep_logs else None
    summary = deploy_local(values, out, args.round_timeout, args.node_wait, args.timeout,
                           args.force, keep, simulation=args.simulation,
                           ray_address=args.ray_address, client_cpus=args.client_cpus,
                           client_gpus=args.client_gpus, auth=args.auth)
    print(
        f"{summary['algorithm']} over Flower ({summary.get('supernodes_finished', summary['clients'])} of "
        f"{summary['clients']} SuperNodes finished): final accuracy "
        f"{summary['final_accuracy']:.4f}, {summary['total_time_s']:.1f} s of rounds; results in {out}"
    )
    return 0


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    _add_setting_flags(p)
    _add_device_flags(p)
    _add_precision_flag(p)


def _add_setting_flags(p: argparse.ArgumentParser, config_help: str = "TOML run file (a path, or a "
                       "shipped file's name: fedhet list)") -> None:
    p.add_argument("--algorithm", "-a")
    p.add_argument("--dataset", "-d")
    p.add_argument("--partition", "-p")
    p.add_argument("--model", "-m")
    p.add_argument("--clients", "-n", type=int)
    p.add_argument("--rounds", "-r", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--data-dir", help="where dataset files are read from (default: data)")
    p.add_argument("--config", "-c", help=config_help)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other setting, e.g. lr=0.1 or algorithm.mu=0.01 (repeatable)")


def _add_device_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("auto", "cpu", "cuda"),
                   help="where models, data and state live (default auto: CUDA when present)")
    p.add_argument("--executor", choices=("auto", "sequential", "batched"),
                   help="how a round's clients run: one after another, or stacked (docs/gpu.md)")
    p.add_argument("--workers", type=_workers, metavar="N|auto",
                   help="CPU processes a round's clients are spread over (sequential executor; "
                        "the same results as 1; default auto: the usable cores when a round's "
                        "work pays for them, else 1; docs/gpu.md)")


def _add_precision_flag(p: argparse.ArgumentParser) -> None:
    """`--precision` of run and compare: a setting of what runs compute (not a runtime override)."""
    p.add_argument("--precision", choices=("fp32", "bf16", "tf32"),
                   help="arithmetic of the local passes: fp32 (default), bf16 autocast (weights "
                        "and server math stay float32) or tf32 (CUDA only); docs/gpu.md says "
                        "where bf16 loses no accuracy")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """`--device`/`--executor`/`--workers` of compare and reproduce: set in every run of the grid."""
    return {k: getattr(args, k) for k in ("device", "executor", "workers") if getattr(args, k)}


def _add_pool_flags(p: argparse.ArgumentParser) -> None:
    _add_device_flags(p)
    p.add_argument("--jobs", "-j", type=_positive, help="parallel runs (default: number of cores)")
    p.add_argument("--batch-runs", type=_positive, metavar="N",
                   help="runs that share data, model and device on the batched executor (a GPU, "
                        "or the linear models) step as one cohort, N at a time (default 8; 1: "
                        "each run on its own)")
    p.add_argument("--force", action="store_true", help="start every run again from scratch")
    p.add_argument("--tensorboard", action="store_true",
                   help="log each run's metrics for TensorBoard (needs tensorboard)")
    _add_cluster_flags(p)


# -- `--cluster ray` of compare and reproduce (docs/cluster.md) ------------------------------
CLUSTER_FLAGS = ("--cluster", "--ray-address", "--cpus-per-run", "--gpus-per-run")


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", choices=("ray",),
                   help="run each run (or batch of runs) as a task on a Ray cluster "
                        "(docs/cluster.md); needs fedhet[cluster]")
    p.add_argument("--ray-address", metavar="ADDR|auto",
                   help="--cluster ray: the cluster to join (default $RAY_ADDRESS, else a local "
                        "Ray started for this grid; auto: the one running on this machine)")
    p.add_argument("--cpus-per-run", type=_share, metavar="N",
                   help="--cluster ray: CPUs each run's task asks for (default 1)")
    p.add_argument("--gpus-per-run", type=_share, metavar="F",
                   help="--cluster ray: GPUs each run's task asks for; a fraction shares one "
                        "GPU between runs, e.g. 0.25 (default 0)")


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {text!r}")
    return value


def _cluster(args: argparse.Namespace) -> dict[str, Any]:
    """`{"cluster": ClusterOptions}` for `--cluster ray`; its options without it, or `--jobs`
    with it, are one line."""
    given = [f for f in CLUSTER_FLAGS[1:] if getattr(args, f[2:].replace("-", "_")) is not None]
    if args.cluster is None:
        if given:
            raise FedhetError(f"{', '.join(given)}: options of --cluster ray; add --cluster ray")
        return {}
    if args.jobs:
        raise FedhetError("--jobs sets local processes; with --cluster ray each run is a task "
                          "sized by --cpus-per-run and --gpus-per-run")
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import ClusterOptions

    cpus = 1.0 if args.cpus_per_run is None else args.cpus_per_run
    gpus = 0.0 if args.gpus_per_run is None else args.gpus_per_run
    return {"cluster": ClusterOptions(args.cluster, args.ray_address, cpus, gpus)}


# -- `--plugin` of every command (fedhet.plugins) ---------------------------------------------
PLUGIN_HELP = ("import this module or .py file first: its algorithms, models, datasets and "
               "partitions join the built-in ones (repeatable; also $FEDHET_PLUGINS, colon-"
               "separated, and installed packages' `fedhet.plugins` entry points)")


def _add_plugin_flag(p: argparse.ArgumentParser, top: bool = False) -> None:
    # before and after the command (`fedhet --plugin x.py run`, `fedhet run --plugin x.py`):
    # two destinations, as a subcommand's defaults would overwrite the top level's value
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py",
                   dest="plugins_first" if top else "plugins", help=PLUGIN_HELP)
    # the top level's False, a command's left unset unless given (so it cannot overwrite it)
    p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="show the full traceback of an error (also $FEDHET_DEBUG=1)")


def _leaf_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    """Every command's parser, nested ones (`config show`) included."""
    out = []
    for parser in dict.fromkeys(sub.choices.values()):
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        out += [leaf for n in nested for leaf in _leaf_parsers(n)] if nested else [parser]
    return out


def _load_plugins(args: argparse.Namespace) -> None:
    """The installed packages' entry points, `$FEDHET_PLUGINS`, then each `--plugin`, with the
    working directory importable (`-m mymodels.nets:tiny` from the folder that holds it)."""
    plugins.working_directory_importable()
    plugins.startup([*args.plugins_first, *getattr(args, "plugins", [])])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedhet", description="Federated learning on non-IID data.")
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="torch threads in this process (default: $FEDHET_THREADS or 1; the papers' small "
        "models and batches run fastest on one thread, and several threads per process slow "
        "parallel runs down badly)",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run one experiment")
    _add_run_flags(run)
    run.add_argument("--out", "-o", help="run directory for config, metrics and checkpoints "
                     "(default: a new runs/<algorithm>-<dataset>-<time>/)")
    run.add_argument("--resume", nargs="?", const=True, metavar="DIR",
                     help="continue the run in DIR (or --out) from its last checkpoint")
    run.add_argument("--force", action="store_true", help="replace a non-empty --out")
    run.add_argument("--quiet", "-q", action="store_true",
                     help="print nothing but errors and warnings (the results are in --out)")
    run.add_argument("--tensorboard", action="store_true",
                     help="also log metrics for TensorBoard into DIR/tensorboard (needs tensorboard)")
    run.set_defaults(func=cmd_run)
    cmp = sub.add_parser(
        "compare", help="run a grid of experiments (docs/grids.md) and tabulate it",
        description="Run a grid file (--config), optionally changed on the command line, or a "
                    "grid written on the command line alone: setting flags and --set fix a "
                    "setting in every run (replacing the grid's axis of it), --sweep and comma "
                    "lists in -a/-d/-p/-m make axes. Example: fedhet compare -a fedavg,fedprox "
                    "-d digits --sweep lr=0.01,0.1 --sweep seed=0,1,2 --out g",
    )
    _add_setting_flags(cmp, "grid TOML file, or a shipped grid's name (fedhet list)")
    _add_precision_flag(cmp)
    cmp.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                     help="an axis: one run per value, crossed with the other axes (repeatable)")
    cmp.add_argument("--out", "-o", help="grid directory (runs/, results.csv, summary.md; "
                     "default: a new runs/<name>-<time>/)")
    cmp.add_argument("--dry-run", action="store_true",
                     help="list the runs and their settings, checked, without running anything")
    cmp.add_argument("--resume", nargs="?", const=True, metavar="DIR",
                     help="continue the grid in DIR (or --out), its runs to more rounds with -r N "
                          "(or other settings a resume may change, --set eval_every=5)")
    _add_pool_flags(cmp)
    cmp.set_defaults(func=cmd_compare)
    rep = sub.add_parser("reproduce", help="re-run a seed paper's experiment (a preset)")
    rep.add_argument("paper", help="fedveca, fednnnn, bherd, fedsr or fednova; `all`: a sitting of "
                     "the campaign (the papers' tables at their own scale, headline cells first, "
                     "recorded under results/campaign; docs/paper-scale.md); `plan`: what the "
                     "campaign has done and has left")
    rep.add_argument("--budget", type=float, metavar="MINUTES",
                     help="all: minutes of this sitting (it stops before they end; run again "
                          "to continue)")
    rep.add_argument("--cores", type=int, metavar="N",
                     help="all: runs at once on the CPU, one thread each (default 1)")
    rep.add_argument("--nice", type=int, default=10, metavar="N",
                     help="all: the runs' scheduling priority (default 10: low)")
    rep.add_argument("--cache", metavar="DIR", help="all, plan: the run directories and their "
                     "checkpoints (default $FEDHET_CAMPAIGN_CACHE or ~/.cache/fedhet/campaign)")
    rep.add_argument("--tables", metavar="TABLES", help="all, plan: only these tables (comma-separated: "
                     "fednnnn-mnist, fedsr-mnist, fedveca-cnn-mnist, bherd-cnn-mnist, fedsr-fashion-mnist)")
    rep.add_argument("--results", metavar="DIR", help="all, plan: where the records and the result "
                     "CSVs go (default results)")
    rep.add_argument("--scale", choices=("smoke", "small", "paper"), help="preset size (default smoke)")
    rep.add_argument("--out", "-o", help="output directory (default runs/PAPER-SCALE, or "
                     "runs/PAPER-PROTOCOL)")
    rep.add_argument("--protocol", metavar="NAME",
                     help="run one of the paper's protocols on your settings instead of its preset "
                          "(fedveca: fair, the fair comparison of §IV-A1); takes the run flags below")
    rep.add_argument("--baselines", help="--protocol: comma-separated methods to compare against "
                     "(fedveca fair: default fedavg,fednova)")
    rep.add_argument("--quiet", "-q", action="store_true", help="--protocol: no progress bar")
    rep.add_argument("--only", metavar="DATASETS",
                     help="only the runs on these datasets (comma-separated, e.g. mnist,mnist-even-odd): "
                          "the parts whose data is here when some are not (CIFAR offline)")
    rep.add_argument("--setup", metavar="NAME",
                     help="the setup of the preset's SVM runs (fedveca, bherd): ref40 (default; reference "
                          "[40]'s: pixels in [0, 1], no bias, zero start, B = 100) or fedhet "
                          "(standardised pixels, a bias); output default runs/PAPER-SCALE-NAME")
    _add_setting_flags(rep)
    _add_pool_flags(rep)
    rep.set_defaults(func=cmd_reproduce)
    report = sub.add_parser("report", help="HTML report with plots of a run or grid directory")
    report.add_argument("dir", help="a run directory or a compare/reproduce directory")
    report.add_argument("--out", help="where report.html and the PNGs go (default: DIR); it "
                        "replaces or removes only files an earlier report wrote there")
    report.add_argument("--screenshot", metavar="PNG",
                        help="also render the page with headless Chromium into PNG (as a reader sees it)")
    report.set_defaults(func=cmd_report)
    page = sub.add_parser("paper-scale", help="write docs/paper-scale.md (the papers' numbers and "
                          "claims beside ours) from results/")
    page.add_argument("--results", default="results", help="result files (default results)")
    page.add_argument("--out", default="docs/paper-scale.md", help="the page (default docs/paper-scale.md)")
    page.set_defaults(func=cmd_paper_scale)
    docs = sub.add_parser("docs", help="the user docs shipped with fedhet: list them, print one "
                          "(fedhet docs grids), or --path to locate it")
    docs.add_argument("topic", nargs="?", help="a doc's name (grids, gpu, deploy, fedveca, ...)")
    docs.add_argument("--path", action="store_true", help="print where the page is, not the page")
    docs.set_defaults(func=cmd_docs)
    ls = sub.add_parser("list", help="settings, algorithms, datasets, partitions, models and "
                        "shipped settings files; a component of a plugin is marked [plugin SPEC]")
    ls.set_defaults(func=cmd_list)
    config = sub.add_parser("config", help="the settings a command would use (config show)")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="show",
                                       parser_class=_Parser)
    show = config_sub.add_parser(
        "show", help="every setting `run` would use with these flags: value and where it came from",
    )
    _add_run_flags(show)
    show.add_argument("--out", "-o", help="as for run (not used)")
    show.add_argument("--resume", nargs="?", const=True, metavar="DIR",
                      help="the settings a resume of DIR (or --out) would use")
    show.add_argument("--force", action="store_true", help="as for run (not used)")
    show.add_argument("--quiet", "-q", action="store_true", help="as for run (not used)")
    show.add_argument("--tensorboard", action="store_true", help="as for run (not used)")
    show.add_argument("--json", action="store_true", help="as JSON: {section: {setting: "
                      "{value, source, note}}}")
    show.set_defaults(func=cmd_config_show)
    part = sub.add_parser("partition", help="per-client sizes and label counts of a partition")
    _add_run_flags(part)
    part.add_argument("--heatmap", help="save a clients × labels heatmap PNG here")
    part.add_argument("--save-indices", metavar="FILE",
                      help='write {"0": [sample indices], ...} as JSON (read by --partition file)')
    part.set_defaults(func=cmd_partition)
    dep = sub.add_parser("deploy", help="run on Flower: SuperLink + SuperNodes (docs/deploy.md)")
    dep.add_argument("mode", choices=["local", "app"],
                     help="local: start a SuperLink and one SuperNode per client on 127.0.0.1 and "
                          "run; app: write the Flower App for `flwr run` on your own federation")
    _add_run_flags(dep)
    dep.add_argument("--out", "-o", help="run directory the server app writes (absolute on its host)")
    dep.add_argument("--app-dir", default="fedhet-app", help="where `app` writes the Flower App")
    dep.add_argument("--round-timeout", type=_seconds, default=600.0,
                     help="seconds to wait for the replies of a round; late clients are dropped")
    dep.add_argument("--node-wait", type=_seconds, default=300.0,
                     help="seconds to wait for one SuperNode per client before the first round")
    dep.add_argument("--timeout", type=_seconds, default=24 * 3600.0, help="local: whole-run limit")
    dep.add_argument("--force", action="store_true", help="replace a non-empty --out")
    dep.add_argument("--keep-logs", metavar="DIR", help="local: keep Flower's logs and home in DIR")
    dep.add_argument("--simulation", action="store_true",
                     help="local: Flower's simulation runtime (Ray; needs fedhet[flower-sim])")
    dep.add_argument("--ray-address", metavar="ADDR",
                     help="--simulation: join this Ray cluster (HOST:PORT of `ray start --head`, "
                          "or auto; default: $RAY_ADDRESS, else a private one-node Ray)")
    dep.add_argument("--client-cpus", type=float, metavar="N",
                     help="--simulation: CPUs each virtual SuperNode's ClientApp holds (default 1)")
    dep.add_argument("--client-gpus", type=float, metavar="G",
                     help="--simulation: GPU share of each virtual SuperNode (e.g. 0.25; default 0)")
    dep.add_argument("--auth", action="store_true",
                     help="only registered SuperNodes join: TLS, --enable-supernode-auth and one "
                          "registered key pair per SuperNode (docs/deploy.md)")
    dep.set_defaults(func=cmd_deploy)
    demo = sub.add_parser("demo", help="FedAvg vs FedNova on digits, Dirichlet 0.5 (embedded)")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--rounds", type=int, default=30)
    demo.add_argument("--force", action="store_true")
    demo.set_defaults(func=cmd_demo)
    _add_plugin_flag(parser, top=True)
    for p in _leaf_parsers(sub):
        _add_plugin_flag(p)
    return parser


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
    argv = list(sys.argv[1:] if argv is None else argv)
    args = None
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv
        if args.debug:  # grid workers and deploy nodes inherit it
            os.environ["FEDHET_DEBUG"] = "1"
        _set_threads(args.threads)
        with plugins.command_line():
            _load_plugins(args)
            return args.func(args)
    except DivergedRunError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    except FedhetError as e:
        if debugging():
            traceback.print_exception(e, file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # `fedhet list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the file system said no: unwritable, not a directory, disk full
        print(f"error: {_os_error(e)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as e:
        if not getattr(e, "reported", False):  # compare/reproduce print their own line
            print(_interrupted(args), file=sys.stderr)
        return 130


def _interrupted(args: argparse.Namespace | None) -> str:
    """The Ctrl-C line: how to continue, naming the run directory (`run`), or that nothing was
    saved yet."""
    out = getattr(args, "run_dir", None)
    if out is None:
        return "interrupted"
    if not (Path(out) / "config.json").is_file():
        return f"interrupted before the run saved anything in {out}"
    return f"interrupted; continue with `{args.resume_hint}`"


if __name__ == "__main__":
    sys.exit(main())
