"""What the verbs of `fedhet` share: the parser class, the flag groups several verbs take, and
the settings the run flags make.

- `Parser`: one error line (and the nearest choice) instead of argparse's usage dump; a verb
  names the flags of other verbs it refuses (`refuse`), each with the line that says where the
  flag goes;
- flag groups: `add_setting_flags` (what a run computes), `add_device_flags` (where),
  `add_precision_flag`, `add_pool_flags` (many runs: jobs, stacks, `--cluster ray`),
  `add_plugin_flag`;
- `run_layers`/`run_values`: the run's settings from `--config`, the flags and `--set`.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

from fedhet.configs import resolve as resolve_config
from fedhet.engine import OldFlag, current_value
from fedhet.errors import FedhetError
from fedhet.registry import did_you_mean

if TYPE_CHECKING:
    from fedhet.engine import ClusterOptions

EXIT_ERROR = 2
"""Bad input or an unusable environment."""
EXIT_DIVERGED = 3
"""The run stopped on non-finite numbers (summary.json says `status: diverged`)."""


class DivergedRunError(FedhetError):
    """A run that stopped on non-finite numbers; exits with `EXIT_DIVERGED`."""


class Parser(argparse.ArgumentParser):
    """A parser whose errors are one `FedhetError` line; `refused` maps a flag of another verb
    (`--cores` given to `reproduce`) to the line that says where it goes; `more_help` adds to
    `--help` what is known only at run time (the registered papers)."""

    refused: dict[str, str]
    more_help: Callable[[], str] | None
    """Text `--help` ends with, made only when help is asked for (it may import what a
    command would)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused = {}
        self.more_help = None

    def format_help(self) -> str:
        more = self.more_help() + "\n" if self.more_help is not None else ""
        return super().format_help() + ("\n" + more if more else "")

    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:  # `fedhet rnu`, `--device cdua`: the nearest choice
            choices = [c.strip().strip("'") for c in m.group(2).split(",")]
            message += did_you_mean(m.group(1), choices)
        raise FedhetError(f"{message} (see `{self.prog} --help`)")

    def refuse(self, flags: Iterable[str], line: str) -> None:
        """Each of `flags` (with its short form) is refused with `line`, `{flag}` in it
        replaced by the flag's long name."""
        for flag in flags:
            long = next((o for o in self._aliases(flag) if o.startswith("--")), flag)
            for name in self._aliases(flag):
                self.refused[name] = line.format(flag=long)

    @staticmethod
    def _aliases(flag: str) -> tuple[str, ...]:
        return SHORT.get(flag, (flag,))

    def unknown(self, extras: list[str]) -> FedhetError:
        """The error for arguments this parser does not take: the first refused flag's line,
        else argparse's own words."""
        for token in extras:
            name = token.split("=", 1)[0]
            if name in self.refused:
                return FedhetError(self.refused[name])
        return FedhetError(f"unrecognized arguments: {' '.join(extras)} (see `{self.prog} --help`)")


SHORT = {
    "--algorithm": ("--algorithm", "-a"), "--dataset": ("--dataset", "-d"),
    "--partition": ("--partition", "-p"), "--model": ("--model", "-m"),
    "--clients": ("--clients", "-n"), "--rounds": ("--rounds", "-r"),
    "--config": ("--config", "-c"), "--jobs": ("--jobs", "-j"), "--quiet": ("--quiet", "-q"),
    "--out": ("--out", "-o"),
}
"""The flags with a short form, as `add_setting_flags` and the verbs spell them."""

SETTING_FLAGS = ("--algorithm", "--dataset", "--partition", "--model", "--clients", "--rounds",
                 "--seed", "--data-dir", "--config", "--set")
"""The flags of `add_setting_flags`."""


def read_toml(given: str) -> dict[str, Any]:
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


RUN_FLAGS = ("algorithm", "dataset", "partition", "model", "clients", "rounds", "seed", "device",
             "executor", "workers", "precision", "data_dir")
"""The settings the command line takes as flags of their own (`-a`, `-d`, ..., `--data-dir`),
by their names in `args`, in the order their layers apply; every other setting is a `--set`."""


def run_layers(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """The run's settings as `(source, {path: value})` layers, later wins: the `--config` file,
    then each flag, then each `--set` (`fedhet.api.setting_layers`, as a Python caller's). The
    source is what `fedhet config show` prints."""
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.api import setting_layers

    config = (args.config, read_toml(args.config)) if args.config else None
    flags = {k: getattr(args, k, None) for k in RUN_FLAGS}
    return setting_layers(flags, list(args.set), config, where="command line",
                          flag_source=lambda k: f"flag --{k.replace('_', '-')}")


def run_values(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings as config paths (`run_layers` merged, later wins)."""
    values: dict[str, Any] = {}
    for _, layer in run_layers(args):
        values.update(layer)
    return values


def names(text: str, flag: str, example: str) -> tuple[str, ...]:
    """A comma-separated list of names; an empty one (`--tables ""`) is one line, not "all"."""
    found = tuple(t.strip() for t in text.split(","))
    if not all(found):
        raise FedhetError(f"{flag} {text!r} has an empty name; give comma-separated names, e.g. "
                          f"{flag} {example}")
    return found


# -- argument types --------------------------------------------------------------------------
def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A time limit: a number of seconds > 0 (`--timeout 0` would stop a run before it starts)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def workers(text: str) -> str | int:
    """`--workers`: `auto` or a whole number ≥ 1 (0 is `auto` only in settings files)."""
    if text.strip().lower() == "auto":
        return "auto"
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number ≥ 1, got {text!r}")
    return int(text)


def share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {text!r}")
    return value


# -- flag groups -----------------------------------------------------------------------------
def add_run_flags(p: argparse.ArgumentParser) -> None:
    add_setting_flags(p)
    add_device_flags(p)
    add_precision_flag(p)


def add_setting_flags(p: argparse.ArgumentParser, config_help: str = "TOML run file (a path, or a "
                      "shipped file's name: fedhet list)") -> None:
    p.add_argument("--algorithm", "-a")
    p.add_argument("--dataset", "-d")
    p.add_argument("--partition", "-p")
    p.add_argument("--model", "-m")
    p.add_argument("--clients", "-n", type=int)
    p.add_argument("--rounds", "-r", type=int)
    p.add_argument("--seed", type=int)
    add_data_dir_flag(p)
    p.add_argument("--config", "-c", help=config_help)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other setting, e.g. lr=0.1 or algorithm.mu=0.01 (repeatable)")


def add_data_dir_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="where dataset files are read from (default: data)")


def add_device_flags(p: argparse.ArgumentParser, where_only: bool = False) -> None:
    """`--device`, and unless `where_only`, `--executor` and `--workers`."""
    p.add_argument("--device", choices=("auto", "cpu", "cuda"),
                   help="where models, data and state live (default auto: CUDA when present)")
    if where_only:
        return
    p.add_argument("--executor", choices=("auto", "sequential", "stacked"), type=executor,
                   help="how a round's clients run: one after another, or stacked (docs/gpu.md)")
    p.add_argument("--workers", type=workers, metavar="N|auto",
                   help="CPU processes a round's clients are spread over (sequential executor; "
                        "the same results as 1; default auto: the usable cores when a round's "
                        "work pays for them, else 1; docs/gpu.md)")


def add_precision_flag(p: argparse.ArgumentParser) -> None:
    """`--precision` of run and compare: a setting of what runs compute (not a runtime override)."""
    p.add_argument("--precision", choices=("fp32", "bf16", "tf32"),
                   help="arithmetic of the local passes: fp32 (default), bf16 autocast (weights "
                        "and server math stay float32) or tf32 (CUDA only); docs/gpu.md says "
                        "where bf16 loses no accuracy")


def executor(value: str) -> str:
    """`--executor`'s value, an earlier release's spelling (`batched`) read as today's with a
    note (`fedhet.engine.spellings`)."""
    return str(current_value("executor", value))


def add_stack_runs_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack-runs", type=positive, metavar="N",
                   help="runs that share data, model and device on the stacked executor (a GPU, "
                        "or the linear models) step as one cohort, N at a time (default 8; 1: "
                        "each run on its own)")
    p.add_argument("--batch-runs", type=positive, dest="stack_runs", action=OldFlag,
                   new="--stack-runs", help=argparse.SUPPRESS)


def add_pool_flags(p: argparse.ArgumentParser) -> None:
    add_device_flags(p)
    p.add_argument("--jobs", "-j", type=positive, help="parallel runs (default: number of cores)")
    add_stack_runs_flag(p)
    p.add_argument("--force", action="store_true", help="start every run again from scratch")
    p.add_argument("--tensorboard", action="store_true",
                   help="log each run's metrics for TensorBoard (needs tensorboard)")
    add_cluster_flags(p)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """`--device`/`--executor`/`--workers` of compare and reproduce: set in every run of the grid."""
    return {k: getattr(args, k) for k in ("device", "executor", "workers") if getattr(args, k)}


def stack_runs(args: argparse.Namespace) -> int | None:
    """`--stack-runs` when given; None: the runner's default (`DEFAULT_STACK_RUNS`)."""
    return int(args.stack_runs) if args.stack_runs else None


# -- `--cluster ray` of compare and reproduce (docs/cluster.md) ------------------------------
CLUSTER_FLAGS = ("--cluster", "--ray-address", "--cpus-per-run", "--gpus-per-run")


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", choices=("ray",),
                   help="run each run (or stack of runs) as a task on a Ray cluster "
                        "(docs/cluster.md); needs fedhet[cluster]")
    p.add_argument("--ray-address", metavar="ADDR|auto",
                   help="--cluster ray: the cluster to join (default $RAY_ADDRESS, else a local "
                        "Ray started for this grid; auto: the one running on this machine)")
    p.add_argument("--cpus-per-run", type=share, metavar="N",
                   help="--cluster ray: CPUs each run's task asks for (default 1)")
    p.add_argument("--gpus-per-run", type=share, metavar="F",
                   help="--cluster ray: GPUs each run's task asks for; a fraction shares one "
                        "GPU between runs, e.g. 0.25 (default 0)")


def cluster(args: argparse.Namespace) -> ClusterOptions | None:
    """The `ClusterOptions` of `--cluster ray` (None without it); its options without it, or
    `--jobs` with it, are one line."""
    given = [f for f in CLUSTER_FLAGS[1:] if getattr(args, f[2:].replace("-", "_")) is not None]
    if args.cluster is None:
        if given:
            raise FedhetError(f"{', '.join(given)}: options of --cluster ray; add --cluster ray")
        return None
    if args.jobs:
        raise FedhetError("--jobs sets local processes; with --cluster ray each run is a task "
                          "sized by --cpus-per-run and --gpus-per-run")
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import ClusterOptions

    cpus = 1.0 if args.cpus_per_run is None else args.cpus_per_run
    gpus = 0.0 if args.gpus_per_run is None else args.gpus_per_run
    return ClusterOptions(args.cluster, args.ray_address, cpus, gpus)


# -- `--plugin` of every command (fedhet.plugins) ---------------------------------------------
PLUGIN_HELP = ("import this module or .py file first: its algorithms, models, datasets and "
               "partitions join the built-in ones (repeatable; also $FEDHET_PLUGINS, colon-"
               "separated, and installed packages' `fedhet.plugins` entry points)")


def add_plugin_flag(p: argparse.ArgumentParser, top: bool = False) -> None:
    # before and after the command (`fedhet --plugin x.py run`, `fedhet run --plugin x.py`):
    # two destinations, as a subcommand's defaults would overwrite the top level's value
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py",
                   dest="plugins_first" if top else "plugins", help=PLUGIN_HELP)
    # the top level's False, a command's left unset unless given (so it cannot overwrite it)
    p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="show the full traceback of an error (also $FEDHET_DEBUG=1)")
