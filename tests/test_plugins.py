"""Plugins (`fedhet.plugins`): a user's own algorithm and model reach every command through
`--plugin`, `$FEDHET_PLUGINS` or an entry point; each run records them, and resume, report,
`config show` and a grid's worker processes import them again. Grids started from Python fork
their workers (a script's own algorithm is known there, and an unguarded script is not re-run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
import types
import uuid
from pathlib import Path

import pytest

from fedhet import plugins
from fedhet.algorithms.base import ALGORITHMS
from fedhet.algorithms.fedavg import FedAvg, FedAvgParams
from fedhet.cli import main
from fedhet.rundir.store import read_metrics
from fedhet.runs import cluster, processes
from fedhet.runs.jobs import Job

SRC = Path(__file__).parent.parent / "src"

PLUGIN = '''
"""FedAvg with server momentum, and a small model: a user's own components."""
import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from fedhet.algorithms.base import ALGORITHMS, Algorithm, ServerState
from fedhet.algorithms.fedavg import client_diagnostics, local_sgd_update, mean_delta
from fedhet.models.registry import MODELS


@dataclass(frozen=True)
class MyParams:
    gamma: float = 0.9


@dataclass(frozen=True, kw_only=True, eq=False)
class MyState(ServerState):
    d: torch.Tensor


@ALGORITHMS.register("my-avgm", MyParams, "FedAvg with server momentum")
class MyAvgM(Algorithm):
    state_class = MyState

    def init(self, w0):
        return MyState(w=w0.clone(), d=torch.zeros_like(w0))

    def client_update(self, message, ctx, state):
        _, _, reply = local_sgd_update(message, ctx)
        return reply, state

    def aggregate(self, state, round, replies):
        acc, delta = mean_delta(replies, "samples")
        d = self.params.gamma * state.d + delta
        return replace(state, w=state.w + d, d=d), client_diagnostics(acc)


@MODELS.register("tiny-mlp", doc="one hidden layer of 16")
def tiny_mlp(input_shape, num_classes, params):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 16), nn.ReLU(),
                         nn.Linear(16, num_classes))
'''

RUN = ["-a", "my-avgm", "-m", "tiny-mlp", "-d", "digits", "-n", "4", "-r", "2"]


@pytest.fixture(autouse=True)
def _own_plugins(monkeypatch):
    """Each test's plugins are this test's: later runs (here or in other test files) do not
    record them, and a later grid's workers do not look for them."""
    monkeypatch.setattr(plugins, "_LOADED", {})


@pytest.fixture(scope="session")
def plugin_file(tmp_path_factory) -> Path:
    """One plugin file for the session (loaded once into this process, as a user's would be)."""
    path = tmp_path_factory.mktemp("plugin") / "my_algos.py"
    path.write_text(PLUGIN)
    return path


def fedhet(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command line in a fresh process (nothing loaded but what it loads itself)."""
    env = {k: v for k, v in os.environ.items() if k != plugins.ENV}
    env.update(PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "fedhet", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_a_plugin_run_resumes_and_reports_from_elsewhere_without_the_flag(plugin_file, tmp_path):
    out = tmp_path / "run"
    made = fedhet("run", "--plugin", str(plugin_file), *RUN, "--out", str(out), "-q",
                  cwd=plugin_file.parent)
    assert made.returncode == 0, made.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["algorithm"] == "my-avgm" and config["plugins"] == [str(plugin_file)]
    assert config["provenance"]["plugins"] == {str(plugin_file): str(plugin_file)}

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = fedhet("run", "--resume", str(out), "-r", "3", "-q", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr
    assert [r["round"] for r in read_metrics(out)][-1] == 3.0
    report = fedhet("report", str(out), cwd=elsewhere)
    assert report.returncode == 0 and "warning" not in report.stderr, report.stderr
    assert "my-avgm" in (out / "report.html").read_text()


def test_config_show_of_a_plugin_run_imports_its_plugin(plugin_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--plugin", str(plugin_file), *RUN, "--out", str(out), "-q"]) == 0
    plugins._LOADED.clear()  # as in a fresh process
    assert main(["config", "show", "--resume", str(out)]) == 0
    assert '"my-avgm"' in capsys.readouterr().out and plugins.loaded() == [str(plugin_file)]


def test_list_marks_a_plugins_components_before_or_after_the_command(plugin_file, capsys):
    for argv in (["list", "--plugin", str(plugin_file)], ["--plugin", str(plugin_file), "list"]):
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        mine = [line for line in lines if line.split()[:1] in (["my-avgm"], ["tiny-mlp"])]
        assert len(mine) == 2 and all(line.endswith(f"[plugin {plugin_file}]") for line in mine)
        fedavg = next(line for line in lines if line.split()[:1] == ["fedavg"])
        assert "[" not in fedavg  # a built-in is unmarked


def test_fedhet_plugins_environment_variable(plugin_file, tmp_path, monkeypatch, capsys):
    other = tmp_path / "other_plugin.py"
    name = f"env-avg-{uuid.uuid4().hex[:8]}"
    other.write_text(
        "from fedhet.algorithms.base import ALGORITHMS\n"
        "from fedhet.algorithms.fedavg import FedAvg, FedAvgParams\n"
        f"@ALGORITHMS.register({name!r}, FedAvgParams, 'from the environment')\n"
        "class EnvAvg(FedAvg):\n    pass\n"
    )
    monkeypatch.setenv(plugins.ENV, os.pathsep.join([str(plugin_file), str(other)]))
    assert main(["run", *RUN, "-a", name, "--out", str(tmp_path / "run"), "-q"]) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert str(other) in config["plugins"] and str(plugin_file) in config["plugins"]


def test_an_installed_packages_entry_point_is_loaded(tmp_path, monkeypatch, capsys):
    package = f"fedhet_ep_{uuid.uuid4().hex[:8]}"
    name = package.replace("_", "-")
    (tmp_path / f"{package}.py").write_text(
        "from fedhet.algorithms.base import ALGORITHMS\n"
        "from fedhet.algorithms.fedavg import FedAvg, FedAvgParams\n"
        f"@ALGORITHMS.register({name!r}, FedAvgParams, 'from an entry point')\n"
        "class EpAvg(FedAvg):\n    pass\n"
    )
    info = tmp_path / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fedhet.plugins]\nmine = {package}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.split()[:1] == [name])
    assert line.endswith(f"[plugin {package}]")
    assert plugins.files()[package] == str(tmp_path / f"{package}.py")


@pytest.mark.parametrize("source, cause", [
    ("import fedhet_no_such_module\n", "ModuleNotFoundError: No module named "
                                       "'fedhet_no_such_module' (line 1)"),
    ("x = 1\ndef f(:\n", "SyntaxError: invalid syntax (line 2)"),
    ("raise ImportError('needs scipy')\n", "ImportError: needs scipy (line 1)"),
])
def test_a_broken_plugin_is_one_line_naming_its_file_and_the_error(source, cause, tmp_path, capsys):
    bad = tmp_path / "broken.py"
    bad.write_text(source)
    assert main(["list", "--plugin", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: plugin {bad} (from --plugin)")
    assert cause in err


def test_a_missing_plugin_file_or_module_is_one_line(tmp_path, capsys):
    assert main(["list", "--plugin", str(tmp_path / "nowhere.py")]) == 2
    assert capsys.readouterr().err == (f"error: plugin {tmp_path / 'nowhere.py'} (from "
                                       "--plugin): no such file; check the path\n")
    assert main(["list", "--plugin", "fedhet_no_such_pkg.algos"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no module named 'fedhet_no_such_pkg'" in err


def test_a_recorded_plugin_that_no_longer_imports_is_one_line_and_nothing_changes(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "-d", "digits", "-n", "4", "-r", "1", "--out", str(out), "-q"]) == 0
    config = json.loads((out / "config.json").read_text())
    gone = tmp_path / "gone.py"
    config.update(algorithm="gone-avg", plugins=[str(gone)])
    (out / "config.json").write_text(json.dumps(config))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "-r", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: plugin {gone}, recorded in {out / 'config.json'}, can no longer be "
                   "imported: no such file; restore it, or give the file that now defines its "
                   "components with --plugin\n")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert main(["report", str(out)]) == 0  # the page is written; the plugin is a warning
    assert f"warning: plugin {gone}" in capsys.readouterr().err


def test_a_grid_of_the_command_line_imports_the_plugin_in_its_workers(plugin_file, tmp_path, capsys):
    out = tmp_path / "grid"
    assert main(["compare", "--plugin", str(plugin_file), *RUN, "-a", "my-avgm,fedavg",
                 "--out", str(out), "-j", "2", "--stack-runs", "1"]) == 0
    for run in ("my-avgm__seed0", "fedavg__seed0"):
        summary = json.loads((out / "runs" / run / "summary.json").read_text())
        assert summary["finished"] and summary["provenance"]["plugins"] == {
            str(plugin_file): str(plugin_file)}
    again = fedhet("compare", *RUN, "-a", "my-avgm,fedavg", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 0 and "2 runs" in again.stdout, again.stderr  # no --plugin


def test_a_worker_whose_plugin_fails_reports_it_on_each_run(tmp_path, monkeypatch):
    monkeypatch.setattr(processes.signal, "signal", lambda *a: None)  # this is pytest's process
    monkeypatch.setattr(processes.signal, "pthread_sigmask", lambda *a: None)
    monkeypatch.setenv(processes.CORES_ENV, "1")
    processes.init_worker(None, 1, {str(tmp_path / "lost.py"): str(tmp_path / "lost.py")})
    try:
        job = Job("a", {"algorithm": "fedavg"}, str(tmp_path / "a"), False)
        (result,) = processes.run_unit([job])
        assert result["error"].startswith(f"plugin {tmp_path / 'lost.py'}, recorded in the "
                                          "grid's process, can no longer be imported")
    finally:
        processes._BROKEN = processes._STOP = None


UNGUARDED = '''
from fedhet.algorithms.base import ALGORITHMS
from fedhet.algorithms.fedavg import FedAvg, FedAvgParams
from fedhet.runs.comparison import compare
from fedhet.runs.grid_document import GridChanges


@ALGORITHMS.register("script-avg", FedAvgParams, "FedAvg, defined in the script")
class ScriptAvg(FedAvg):
    pass


rows = compare(None, {out!r}, jobs=2, stack_runs=1, changes=GridChanges(
    fixed={{"dataset": "digits", "rounds": 2, "clients": 4}},
    sweeps={{"algorithm": ["script-avg", "fedavg"]}}, title="script"))
print("statuses", sorted(r["status"] for r in rows))
'''


def test_a_grid_from_an_unguarded_script_with_its_own_algorithm(tmp_path):
    script = tmp_path / "grid_script.py"
    script.write_text(UNGUARDED.format(out=str(tmp_path / "grid")))
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "statuses ['finished', 'finished']" in done.stdout
    assert json.loads((tmp_path / "grid" / "runs" / "script-avg__seed0" / "summary.json")
                      .read_text())["finished"]


def test_fresh_workers_are_refused_in_one_line_for_an_unguarded_script(tmp_path, monkeypatch):
    script = tmp_path / "mine.py"
    script.write_text("import fedhet\nfedhet.compare()\n")
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=str(script)))
    monkeypatch.setattr(processes.torch.cuda, "is_initialized", lambda: True)  # fork unusable
    with pytest.raises(processes.FedhetError, match=r'if __name__ == "__main__":.*plugin module'):
        processes.worker_context()
    script.write_text("import fedhet\nif __name__ == '__main__':\n    fedhet.compare()\n")
    assert processes.worker_context().get_start_method() in ("forkserver", "spawn")


def test_a_grid_from_python_forks_and_the_command_line_keeps_fresh_workers():
    if "fork" in processes.multiprocessing.get_all_start_methods():
        assert processes.worker_context().get_start_method() == "fork"
    with plugins.command_line():
        assert processes.worker_context().get_start_method() in ("forkserver", "spawn")


def test_a_notebooks_component_is_refused_for_fresh_workers_and_ray(tmp_path, monkeypatch):
    name = f"nb-avg-{uuid.uuid4().hex[:8]}"
    notebook_class = type("NotebookAvg", (FedAvg,), {"__module__": "__main__"})
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # no __file__
    units = [[Job("a", {"algorithm": name}, str(tmp_path / "a"), False)]]
    with ALGORITHMS.added(name, notebook_class, FedAvgParams):
        with pytest.raises(processes.FedhetError, match=f"algorithm '{name}' is defined in this "
                                                     "session.*plugin module"):
            processes.check_fresh_workers(units)
        with pytest.raises(processes.FedhetError, match="Ray workers import components from "
                                                     "modules: move it into a plugin module"):
            cluster.check_importable(units)
        guarded = tmp_path / "guarded.py"  # a script's workers import it again: they know it
        guarded.write_text("if __name__ == '__main__':\n    pass\n")
        monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=str(guarded)))
        processes.check_fresh_workers(units)
    cluster.check_importable([[Job("b", {"algorithm": "fedavg"}, str(tmp_path / "b"), False)]])


def test_a_plugin_does_not_claim_the_built_ins_it_imports(plugin_file, tmp_path):
    code = ("from fedhet.plugins import load_plugins\n"
            f"load_plugins({str(plugin_file)!r})\n"
             "from fedhet.algorithms.base import ALGORITHMS\n"
             "print(ALGORITHMS.get('fedavg').source, '|', ALGORITHMS.get('my-avgm').source)\n")
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"fedhet | plugin {plugin_file}"


def test_a_module_plugin_and_a_module_a_script_imported_are_recorded_by_name(tmp_path, monkeypatch):
    module = f"fedhet_mod_{uuid.uuid4().hex[:8]}"
    name = module.replace("_", "-")
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(f"""
        from fedhet.algorithms.base import ALGORITHMS
        from fedhet.algorithms.fedavg import FedAvg, FedAvgParams
        @ALGORITHMS.register({name!r}, FedAvgParams)
        class ModAvg(FedAvg):
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(module)  # imported by a script, not as a plugin
    assert ALGORITHMS.get(name).source == module
    assert plugins.for_run({"algorithm": name})[module] == str(tmp_path / f"{module}.py")
    assert module not in plugins.for_run({"algorithm": "fedavg"})


def test_a_flower_run_carries_its_plugins_to_the_server_app_and_the_super_nodes(plugin_file):
    """`fedhet deploy --plugin`: the app's run config names the plugins, and a SuperNode (or
    the ServerApp) that has not loaded them imports them before it builds its half."""
    # Flower is an optional extra: only this test needs it
    from fedhet.deploy.project import app_pyproject

    settings = {"algorithm": "my-avgm", "model": "tiny-mlp", "dataset": "digits", "clients": 2}
    plugins.load(str(plugin_file))
    text = app_pyproject(settings, Path("out"))
    assert str(plugin_file) in text
    recorded = json.loads(tomllib.loads(text)["tool"]["flwr"]["app"]["config"]["fedhet-settings"])
    assert recorded["plugins"] == [str(plugin_file)]
    node = ("import json, sys\nfrom fedhet.deploy import client_app\n"
            "world = client_app.build_world(json.loads(sys.argv[1]))\n"
            "print(type(world.algorithm).__name__, type(world.model.module).__name__)")
    done = subprocess.run([sys.executable, "-c", node, json.dumps(recorded)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "MyAvgM"
