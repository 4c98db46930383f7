"""The paper registry.

- `PRESETS.get(paper).factory(scale)` is a paper's `Preset` (`fedhet reproduce PAPER`);
  `factory(scale, setup=NAME)` one of the setups in `SETUPS[paper]` (`--setup NAME`).
- `REF40`, `SVM_SETUPS`: the SVM setup of reference [40], which the papers citing it for their
  SVM (BHerd, FedVeca) share, and fedhet's own;
- `protocol(paper, name)` is one of a paper's own procedures run on the user's settings
  (`fedhet reproduce PAPER --protocol NAME`), e.g. FedVeca's fair comparison.

Each paper is one package under `fedhet.papers` (its preset, protocols, plots and
published numbers); its modules register here, and importing `fedhet.papers`
(which any import of this module does first) imports every paper. Adding a paper is adding a
folder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError
from fedhet.registry import Registry
from fedhet.runs import PresetFactory

PRESETS: Registry[PresetFactory] = Registry("paper")


@dataclass(frozen=True)
class Protocol:
    """A paper's procedure on the user's settings.

    `run(settings, out, baselines=..., force=..., progress=..., lines=...)` gets the merged
    settings (`defaults`, then the user's) as config paths and returns the lines to print at the
    end; `baselines` is the user's list of methods to compare against, or None for the default;
    `progress` asks for a live bar (a terminal), `lines` for a progress line now and then (a log
    file)."""

    help: str
    defaults: Mapping[str, Any]
    run: Callable[..., list[str]]


SETUPS: dict[str, tuple[str, ...]] = {}
"""Paper → the setups its preset runs in (`fedhet reproduce PAPER --setup NAME`), its default
first. A paper with setups registers its preset as `factory(scale, setup=None)`."""


def register_setups(paper: str, names: tuple[str, ...]) -> None:
    if paper in SETUPS:
        raise ValueError(f"setups of preset {paper} registered twice")
    SETUPS[paper] = tuple(names)


REF40: dict[str, Any] = {
    "dataset.normalize": False, "model.bias": False, "model.init": "zeros", "model.lam": 0.1,
    "batch_size": 100, "lr": 0.01,
}
"""The SVM setup of the papers' reference [40] (Wang et al., "Adaptive federated learning in
resource constrained edge computing systems", 2019, and its public code), which BHerd and
FedVeca cite for their SVM: pixels in [0, 1] (not standardised), zero initial weights, no bias,
`λ = 0.1`, `B = 100`, `η = 0.01`; its "loss" is the training loss over the whole training set
(`train_loss`, logged by every SVM run here)."""
SVM_SETUPS: dict[str, dict[str, Any]] = {"default": {}, "ref40": REF40}
"""`setup` of the SVM runs: fedhet's (standardised pixels, PyTorch's initialisation, a bias,
`B = 50`) or reference [40]'s."""


def svm_setup(setups: Mapping[str, Mapping[str, Any]], scale: str, setup: str | None) -> dict[str, Any]:
    """The settings a preset's SVM runs get in `setup` (None: the first of `setups`, the
    default); `{}` at `smoke`, which has no SVM run, and one error line for a setup there."""
    if scale == "smoke":
        if setup is not None:
            raise FedhetError(f"--setup {setup}: the setups change the SVM runs and the smoke scale "
                              "has none (logistic regression on digits); use --scale small or paper")
        return {}
    return dict(setups[setup or next(iter(setups))])


PROTOCOLS: dict[str, dict[str, Protocol]] = {}
"""Paper → protocol name → `Protocol`."""


def register_protocol(paper: str, name: str, entry: Protocol) -> None:
    table = PROTOCOLS.setdefault(paper, {})
    if name in table:
        raise ValueError(f"protocol {paper} {name!r} registered twice")
    table[name] = entry


def protocol(paper: str, name: str) -> Protocol:
    """The paper's protocol `name`, or one error line listing the paper's protocols."""
    PRESETS.get(paper)  # an unknown paper fails with the list of papers
    table = PROTOCOLS.get(paper, {})
    if name not in table:
        have = ", ".join(sorted(table)) or "none"
        raise FedhetError(f"paper {paper} has no protocol {name!r}; its protocols: {have}")
    return table[name]


def run_protocol(paper: str, name: str, settings: Mapping[str, Any], out: Path, **kw: Any) -> list[str]:
    return protocol(paper, name).run(dict(settings), Path(out), **kw)
