"""fedhet from Python: `run`, `resume`, `open_run` and `compare` (docs/library.md).

The command line is a thin layer over these functions: `fedhet run` and `fedhet.run` with the
same settings make the same run directory, byte for byte in `config.json` and `metrics.csv`.

Settings come in three layers, later wins, as on the command line: a TOML run file
(`config`), the keywords (`algorithm`, `dataset`, `partition`, `model` and every engine field
of `RunConfig`: `clients`, `rounds`, `seed`, `lr`, `device`, ...; `RunSettings` lists their
types), then `settings`, whose keys are exactly those of `--set` and of TOML files (`"lr"`,
`"partition.alpha"`, `"algorithm.mu"`: a component's parameters, which no keyword can spell).
`RunConfig`'s fields are the one list of what a keyword may be: an unknown keyword is one
`FedhetError` naming the closest field.

`dataset`, `model` and `algorithm` also take Python objects: a `Dataset` (`from_arrays`,
`from_huggingface`), a model factory `(input_shape, num_classes, params) -> nn.Module`, an
`Algorithm` subclass. Such an object is used under a name (`components.name_of`), which is
what the run's `config.json` records; see there how a later `resume` finds it again.

Plugins (`fedhet.load_plugins`, `$FEDHET_PLUGINS`, installed packages' `fedhet.plugins` entry
points) are loaded before the first run, as the CLI loads them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

from fedhet import plugins
from fedhet.components import name_of
from fedhet.engine import ENGINE_FIELDS, RunConfig, chosen_components, parse, read_toml_file
from fedhet.errors import FedhetError, deprecated
from fedhet.rundir import RunResult, open_run
from fedhet.runs import GridChanges, execute
from fedhet.runs import compare as run_grid


class RunSettings(TypedDict, total=False):
    """The engine settings `run` and `compare` take as keywords, for type checkers: the engine
    fields of `RunConfig` (`fedhet.engine.config`, where each is documented), whose names are
    what the keywords are checked against at run time; tests/test_api_settings.py keeps the two
    equal. Types are those a caller may write: a number for a float, `"auto"` for `workers`, a
    list for a tuple."""

    clients: int
    rounds: int
    seed: int
    lr: float
    lr_schedule: Literal["constant", "cosine"]
    lr_min: float
    batch_size: int
    local_epochs: float
    local_steps: int
    client_steps: Sequence[int]
    epochs_min: int
    epochs_max: int
    momentum: float
    weight_decay: float
    client_optimizer: Literal["sgd", "adam", "adamw"]
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    sample_fraction: float
    batch_order: Literal["reshuffle", "fixed"]
    eval_every: int
    train_loss: bool
    checkpoint_every: int
    validation_fraction: float
    client_eval_fraction: float
    client_eval_every: int
    client_eval_finetune_steps: int
    metrics: Sequence[str]
    data_dir: str | Path
    client_dropout: float
    straggler_fraction: float
    straggler_policy: Literal["drop"]
    device: Literal["auto", "cpu", "cuda"]
    executor: Literal["sequential", "stacked", "auto"]
    cohort_chunk: int
    precision: Literal["fp32", "bf16", "tf32"]
    workers: int | Literal["auto"]
    client_state_memory_mb: float


class GridSettings(RunSettings, total=False):
    """`compare`'s keywords: `RunSettings` and the four components, each a name or a Python
    object (a `Dataset`, a model factory, an `Algorithm` subclass), as in `base`."""

    algorithm: Any
    dataset: Any
    partition: str
    model: Any


COMPONENT_KEYWORDS = ("algorithm", "dataset", "partition", "model")
"""The keywords that name a run's components; they come first among the keyword layers."""


def run(
    algorithm: Any = None, dataset: Any = None, partition: str | None = None, model: Any = None,
    *, config: str | Path | None = None, settings: Mapping[str, Any] | None = None,
    out: str | Path | None = None, force: bool = False, progress: bool = False,
    callbacks: Sequence[Any] = (), log: Callable[[str], None] | None = None,
    **keywords: Unpack[RunSettings],
) -> RunResult:
    """Run one experiment into `out` (default `runs/<algorithm>-<dataset>-<time>/`) and return
    it. Its remarks (`workers: auto → N`, an algorithm's notes, warnings) go to `log`, by
    default to stderr: stdout is left to the caller (`log=print` puts them there).
    Invalid settings, data or partitions fail with a `FedhetError` before anything is
    written; `out` must be new or empty (`force=True` replaces a run fedhet made there).

    `callbacks`: called with each round's metrics row once it is saved (a callable, or an
    object with `on_start(run)`, `on_round(row)`, `on_end(summary)`); a truthy return from a
    round stops the run there (`summary["status"] == "stopped"`; `resume` continues it).

    `**keywords`: engine settings by name (`clients=20, rounds=50, lr=0.05`; `RunSettings`),
    checked against `RunConfig`'s fields."""
    plugins.startup()
    flags = {"algorithm": algorithm, "dataset": dataset, "partition": partition, "model": model,
             **checked_keywords(keywords, "fedhet.run", {"algorithm": algorithm, "model": model,
                                                         "dataset": dataset, "partition": partition})}
    values = settings_of(flags, settings, config)
    target = Path(out) if out is not None else new_run_dir(default_name(values))
    execute(values, target, force=force, progress=progress, log=log or to_stderr,
            callbacks=list(callbacks))
    return open_run(target)


def resume(
    dir: str | Path, *, rounds: int | None = None, settings: Mapping[str, Any] | None = None,
    dataset: Any = None, model: Any = None, algorithm: Any = None, progress: bool = False,
    callbacks: Sequence[Any] = (), log: Callable[[str], None] | None = None,
) -> RunResult:
    """Continue the run in `dir` from its newest checkpoint, exactly where it stopped, to its
    own `rounds` or to more `rounds`; remarks go to `log` (default stderr), as for `run`.
    `settings` may change only what a resume can (more
    rounds, evaluation and checkpoint intervals, data directory, device, executor).

    A run made with a component handed in from a script or notebook (not importable by name)
    needs the same object again: `resume(dir, algorithm=MyAlgorithm)`. Components from a plugin
    or an importable module are found from `config.json`."""
    plugins.startup()
    for obj in (dataset, model, algorithm):
        if obj is not None:
            name_of(_kind(obj, dataset, model), obj)
    changes = dict(settings or {})
    if rounds is not None:
        changes["rounds"] = rounds
    execute(changes or None, Path(dir), resume=True, progress=progress, log=log or to_stderr,
            callbacks=list(callbacks))
    return open_run(dir)


def to_stderr(line: str) -> None:
    """Where the API's runs say their remarks unless given a `log`: stderr, not the caller's
    stdout."""
    print(line, file=sys.stderr, flush=True)


def _kind(obj: Any, dataset: Any, model: Any) -> str:
    return "dataset" if obj is dataset else "model" if obj is model else "algorithm"


def compare(
    base: Mapping[str, Any] | None = None, sweeps: Mapping[str, Sequence[Any]] | None = None, *,
    config: str | Path | None = None, out: str | Path | None = None, jobs: int | None = None,
    force: bool = False, title: str | None = None, stream: Any = None,
    tensorboard: bool = False, stack_runs: int | None = None, cluster: Any = None,
    runtime: Mapping[str, Any] | None = None, sources: Mapping[str, str] | None = None,
    hint: str | None = None, extend: bool = False, batch_runs: int | None = None,
    **keywords: Unpack[GridSettings],
) -> list[dict[str, Any]]:
    """Run a grid and return its table (`results.csv`'s rows). `base`: settings every run gets
    (`--set`'s keys, flag names, or Python objects for `dataset`/`model`/`algorithm`);
    `sweeps`: one axis per key (`{"algorithm": ["fedavg", "fednova"], "seed": [0, 1, 2]}`),
    every combination one run; or a grid file `config` changed by them. `jobs` runs that many
    runs at once in worker processes (default: the usable cores); from a script or notebook,
    the workers inherit what the script defined. Calling again with the same `out` resumes.

    `runtime`: where every run computes (`device`, `executor`, `workers`), which a resumed grid
    may change; `stack_runs`: runs stepped as one cohort on the stacked executor; `cluster`: a
    `ClusterOptions` to run on Ray; `tensorboard`: TensorBoard logs per run. `sources` names
    each setting as the caller wrote it (for error lines) and `hint` the call that resumes.
    `extend=True` continues a grid's finished runs to more `rounds` (or other settings a resume
    may change, `base={"rounds": 50}`), as `resume` does one run.

    `**keywords`: settings every run gets, by name (`dataset=data, clients=20`; `GridSettings`),
    checked against `RunConfig`'s fields; the same key in `base` too is refused. `batch_runs`
    is an earlier release's name of `stack_runs`, read as it this release with a warning."""
    plugins.startup()
    stack_runs = _stack_runs(stack_runs, batch_runs)
    given = checked_keywords(keywords, "fedhet.compare", {**(base or {}), **keywords})
    twice = sorted(set(given) & set(base or {}))
    if twice:
        raise FedhetError(f"fedhet.compare: {twice[0]!r} is given both in base and as a keyword; "
                          "give it once")
    fixed = {k: _named(k, v) for k, v in {**(base or {}), **given}.items()}
    axes = {k: [_named(k, v) for v in vs] for k, vs in (sweeps or {}).items()}
    for k, vs in (sweeps or {}).items():
        if isinstance(vs, str) or not vs:
            raise FedhetError(f"sweeps[{k!r}] must be a non-empty list of values")
    if config is None and not axes and not fixed:
        raise FedhetError("compare needs a grid: sweeps={...}, base={...}, or config=GRID.toml")
    said = {k: f"base[{k!r}]" for k in base or {}} | {k: f"keyword {k}" for k in given}
    said |= {k: f"sweeps[{k!r}]" for k in axes}
    said.update(sources or {})
    named = title if title is not None else (None if config else _title(fixed, axes))
    changes = GridChanges(fixed, axes, said, named)
    target = Path(out) if out is not None else new_run_dir(_dir_name(fixed, axes))
    extra = {"stack_runs": stack_runs} if stack_runs else {}
    return run_grid(config, target, jobs, force, tensorboard, stream=stream,
                    overrides=dict(runtime) if runtime else None, changes=changes or None,
                    hint=hint or f"fedhet.compare(..., out={str(target)!r})", cluster=cluster,
                    extend=extend, **extra)


def _stack_runs(stack_runs: int | None, batch_runs: int | None) -> int | None:
    """`compare`'s `stack_runs`, or `batch_runs`, its name in an earlier release, with the
    warning that says so (docs/cli.md, migration); both given is an error."""
    if batch_runs is None:
        return stack_runs
    if stack_runs is not None:
        raise FedhetError("fedhet.compare: stack_runs and batch_runs (its earlier name) are both "
                          "given; give stack_runs alone")
    deprecated("fedhet.compare: `batch_runs` is now `stack_runs`; the old name goes in the next "
               "release (docs/cli.md)")
    return batch_runs


def checked_keywords(keywords: Mapping[str, Any], where: str,
                     components: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`keywords` as given, each checked to be a field of `RunConfig` (`ENGINE_FIELDS`, the one
    list): an unknown one is the one-line error `parse` gives an unknown setting, naming the
    closest field (`lrr` → `lr`, `learning_rate` → `lr`; `mu` → `algorithm.mu` when the run's
    algorithm, among `components`, has it); a component's parameter or a record key is refused
    with where it goes."""
    chosen = chosen_components({k: v for k, v in (components or {}).items() if isinstance(v, str)})
    for key, value in keywords.items():
        if key in ENGINE_FIELDS:
            continue
        parse({key: value}, f"{where} keyword", chosen)  # raises for a name that is no setting
        example = key if "." in key else "algorithm.mu"
        raise FedhetError(f"{where}: {key!r} is not a keyword setting: keywords are RunConfig's "
                          f"fields (`fedhet list`); a component's parameter goes in "
                          f"settings={{{example!r}: ...}}")
    return dict(keywords)


def setting_layers(
    flags: Mapping[str, Any], settings: Mapping[str, Any] | Sequence[str] | None = None,
    config: tuple[str, Mapping[str, Any]] | None = None, *,
    flag_source: Callable[[str], str] = "keyword {}".format, where: str = "keyword arguments",
) -> list[tuple[str, dict[str, Any]]]:
    """A run's settings as `(source, {path: value})` layers, later wins: the `config` file
    (`(name, document)`), then each flag given (a keyword of `run`, a flag of the command line;
    `None` and `""` are not given), in `flags`' order, then `settings` (a mapping, or the command
    line's `key=value` pairs, one layer each); each read by the one parser,
    `fedhet.engine.config.parse`. `flag_source` names a flag's layer (`fedhet config show`
    prints it), `where` names the flags in error lines. The API and the CLI both build runs so."""
    layers: list[tuple[str, dict[str, Any]]] = []
    given = {k: _named(k, v) for k, v in flags.items() if v is not None and v != ""}
    if isinstance(settings, Mapping):
        named = {k: _named(k, v) for k, v in settings.items()}
    else:  # `key=value` pairs: the component names among them
        named = {k.strip(): v.strip() for k, eq, v in (p.partition("=") for p in settings or ()) if eq}
    chosen = chosen_components(config[1] if config is not None else {}, given, named)
    if config is not None:
        name, doc = config
        layers.append((f"file {name}", parse(doc, name, chosen)))
    for k, v in given.items():
        layers.append((flag_source(k), parse({k: v}, where, chosen)))
    if isinstance(settings, Mapping):
        layers.append(("settings", parse(named, "settings", chosen)))
    else:
        layers += [("flag --set", parse([pair], "--set", chosen)) for pair in settings or ()]
    return layers


def settings_of(
    flags: Mapping[str, Any], settings: Mapping[str, Any] | None, config: str | Path | None,
) -> dict[str, Any]:
    """The run's settings as config paths: `setting_layers` merged (later wins)."""
    doc = None if config is None else (str(config), read_toml_file(Path(config), "config file")[1])
    values: dict[str, Any] = {}
    for _, layer in setting_layers(flags, settings, doc):
        values.update(layer)
    return values


def _named(key: str, value: Any) -> Any:
    """A setting's value with a Python component (a dataset, model factory or algorithm class)
    replaced by the name it runs under (`components.name_of`)."""
    if key in ("dataset", "model", "algorithm") and not isinstance(value, str | Path):
        return name_of(key, value)
    return str(value) if isinstance(value, Path) else value


def default_name(values: Mapping[str, Any]) -> str:
    """`<algorithm>-<dataset>` of a run made without `out` (a path's file stem, a
    `module:object` spec's object)."""
    return f"{_short(values.get('algorithm', RunConfig.algorithm))}-" \
           f"{_short(values.get('dataset', RunConfig.dataset))}"


def _short(name: Any) -> str:
    text = str(name).rsplit(":", 1)[-1]
    return Path(text).stem if "/" in text or "\\" in text else text


def _title(fixed: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> str:
    methods = axes.get("algorithm") or [fixed.get("algorithm", "fedavg")]
    data = axes.get("dataset") or [fixed.get("dataset", "digits")]
    return f"{' vs '.join(_short(m) for m in methods)} on {', '.join(_short(d) for d in data)}"


def _dir_name(fixed: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> str:
    methods = "+".join(_short(m) for m in axes.get("algorithm") or [fixed.get("algorithm", "fedavg")])
    data = "+".join(_short(d) for d in axes.get("dataset") or [fixed.get("dataset", "digits")])
    return f"{methods[:60]}-{data[:40]}".replace("/", "_")


def new_run_dir(name: str, root: Path = Path("runs")) -> Path:
    """`runs/<name>-<YYYYmmdd-HHMMSS>`, never an existing path (`-2`, `-3`, ... appended): where
    a run or grid is written when no `out` is given."""
    base = root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = Path(f"{base}-{n}")
    return out


