"""What produced a run: fedhet's version and commit, torch, NumPy, Python, the device, the plugins.

`provenance(device)` is written as `"provenance"` into every run's `config.json` and
`summary.json` (`fedhet.rundir.store.RunStore`), and report pages show it. The git commit and
whether the tree was dirty are known only when fedhet runs from a checkout; asking git is
bounded by a timeout and never fails a run (None when it cannot say).
"""

from __future__ import annotations

import functools
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedhet import plugins
from fedhet.version import __version__

GIT_TIMEOUT_S = 5.0
"""How long `git` may take to name the commit before provenance says None."""


def provenance(device: str, plugin_files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The run's provenance: `fedhet` (version), `commit` and `dirty` (None outside a git
    checkout), `torch`, `numpy`, `python` (versions), `device` (resolved, with the GPU's name
    for CUDA) and `plugins`: each plugin's spec → the file it was loaded from (`plugin_files`,
    default every plugin loaded in this process)."""
    # lazy: the command line imports this module's callers before torch is wanted
    import numpy
    import torch

    commit, dirty = git_state()
    return {
        "fedhet": __version__,
        "commit": commit,
        "dirty": dirty,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "device": describe_device(device),
        "plugins": dict(plugins.files() if plugin_files is None else plugin_files),
    }


def describe_device(device: str) -> str:
    """`device` resolved (`auto` → `cuda` or `cpu`), with the GPU's name for CUDA
    (`cuda (NVIDIA H100 80GB HBM3)`)."""
    import torch  # lazy, as in `provenance`

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and torch.cuda.is_available():
        try:
            return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
        except (RuntimeError, AssertionError, ValueError):
            return device
    return device


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str | None, bool | None]:
    """`(commit, dirty)` of the checkout fedhet's package lies in, or `(None, None)` when it is
    not in one (an installed wheel), git is missing, or git does not answer in time. Asked once
    per process."""
    package = Path(__file__).resolve().parent
    root = _checkout_root(package)
    if root is None:
        return None, None
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None or len(commit) != 40:
        return None, None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return commit, (None if status is None else bool(status))


def _checkout_root(package: Path) -> Path | None:
    """fedhet's own checkout: the directory holding `.git` (a directory, or a worktree's file)
    that holds the package as `src/fedhet` or `fedhet`; None for a package installed elsewhere
    (a virtual environment inside some other repository is not fedhet's checkout)."""
    for root in (package.parent.parent, package.parent):
        if (root / ".git").exists() and (root / "pyproject.toml").is_file():
            return root
    return None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


__all__ = ["describe_device", "git_state", "provenance"]


def of_run(config: dict[str, Any]) -> dict[str, Any]:
    """The provenance of the run whose settings are `config`, in this process (what its
    `RunStore` records): `provenance` with the plugins the run needs (`plugins.for_run`), and
    where components were handed in from a script or notebook, `in_process` (which a later
    process cannot build again: `plugins.in_process`) and `scripts` (the file, line and object
    of their code: `plugins.script_sources`), and `script_metrics`, the metrics registered by a
    script or notebook (`plugins.script_metrics`)."""
    record = provenance(str(config.get("device", "auto")), plugins.for_run(config))
    metrics = plugins.script_metrics(config)
    if metrics:
        record = {**record, "script_metrics": metrics}
    handed_in = plugins.in_process(config)
    if not handed_in:
        return record
    return {**record, "in_process": handed_in, "scripts": plugins.script_sources(config)}
