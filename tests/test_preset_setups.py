"""`fedhet reproduce fedveca|bherd --setup NAME`: the SVM runs of a preset in fedhet's setup or in
reference [40]'s, the other runs untouched, and one error line for a setup that
does not exist, a paper without setups, the smoke scale, `--protocol` and the campaign."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_errors import one_error_line

from fedhet.engine.config import config_of
from fedhet.papers.base import SETUPS
from fedhet.papers.bherd.preset import REF40
from fedhet.papers.fedveca import preset as fv
from fedhet.papers.fedveca.protocol import FairBudget
from fedhet.papers.reproduce import default_out, load_preset
from fedhet.runs.presets import RunSpec

FEDHET_SVM = {"dataset.normalize", "model.bias", "model.init"}
"""Keys fedhet's setup leaves at their defaults (standardised pixels, a bias, PyTorch's init)."""


def stage1(paper: str, scale: str, setup: str | None) -> list[RunSpec]:
    return load_preset(paper, scale, setup).stages[0](Path("unused"))


@pytest.mark.parametrize(("paper", "default"), [("fedveca", "ref40"), ("bherd", "ref40")])
@pytest.mark.parametrize("scale", ["small", "paper"])
def test_a_setup_changes_the_svm_runs_only(paper: str, default: str, scale: str) -> None:
    assert SETUPS[paper][0] == default and set(SETUPS[paper]) == {"fedhet", "ref40"}
    ref40, plain, none = (stage1(paper, scale, s) for s in ("ref40", "fedhet", None))
    # the same runs under the same names; the default setup is what no --setup gives
    assert [s.name for s in ref40] == [s.name for s in plain] == [s.name for s in none]
    assert none == (ref40 if default == "ref40" else plain)
    svm = 0
    for a, b in zip(ref40, plain, strict=True):
        config_of(a.settings, a.name)  # every key is a valid setting
        if a.settings["model"] != "svm":
            assert a.settings == b.settings  # the CNNs have one setup
            continue
        svm += 1
        for key, value in REF40.items():
            if key == "batch_size" and "batch-" in a.name:
                continue  # BHerd's batch-size sweep sets B itself
            assert a.settings[key] == value, (a.name, key)
        assert not FEDHET_SVM & set(b.settings), b.name
        assert b.settings["batch_size"] == (32 if paper == "fedveca" else 50) or "batch-" in b.name
    assert svm > 0


def test_fedveca_fair_baselines_inherit_the_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage 2 (the fair FedAvg/FedNova/centralized runs of §IV-A1) is built from the group's
    settings, so in the ref40 setup the baselines train the same SVM on the same pixels."""
    seen: list[dict] = []

    def budget(run_dir: Path, settings: dict) -> FairBudget:  # the FedVeca run's τ_all, faked
        seen.append(settings)
        return FairBudget(tau_all=1000, rounds=settings["rounds"], client_sizes=(6000,) * 5,
                          batch_size=settings["batch_size"])

    monkeypatch.setattr(fv, "budget_from_run", budget)
    monkeypatch.setattr(fv, "atomic_write_text", lambda *a, **k: None)
    group = next(g for g in fv.groups("paper", "ref40") if g.key == "svm-mnist-even-odd-case3-s0")
    specs = fv.baseline_specs(group, Path("unused"))
    assert {s.settings["algorithm"] for s in specs} >= {"fedavg", "fednova"}
    for s in specs:
        assert s.settings["batch_size"] == 100 and s.settings["model.bias"] is False
        assert s.settings["dataset.normalize"] is False and s.settings["model.init"] == "zeros"
    assert seen and seen[0]["batch_size"] == 100


def test_a_setup_other_than_the_default_has_its_own_output() -> None:
    assert default_out("bherd", "paper", None) == default_out("bherd", "paper", "ref40") \
        == Path("runs/bherd-paper")
    assert default_out("bherd", "paper", "fedhet") == Path("runs/bherd-paper-fedhet")
    assert default_out("fedveca", "small", "fedhet") == Path("runs/fedveca-small-fedhet")
    assert default_out("fednnnn", "paper", None) == Path("runs/fednnnn-paper")


@pytest.mark.parametrize(("argv", "message"), [
    (["fedveca", "--scale", "paper", "--setup", "ref4"],
     "--setup 'ref4': preset fedveca's setups are ref40, fedhet (default ref40) (did you mean 'ref40'?)"),
    (["fednnnn", "--scale", "paper", "--setup", "ref40"],
     "--setup: preset fednnnn runs in one setup only; presets with setups: bherd (ref40/fedhet), "
     "fedveca (ref40/fedhet)"),
    (["bherd", "--setup", "fedhet"], "--setup fedhet: the setups change the SVM runs and the smoke "
     "scale has none"),
    (["fedveca", "--setup", "ref40", "--protocol", "fair"], "--setup chooses a preset's setup"),
    (["all", "--budget", "1", "--setup", "ref40"], "--setup goes with one paper's preset"),
])
def test_bad_setups_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
                                 message: str) -> None:
    out = tmp_path / "out"
    assert one_error_line(capsys, ["reproduce", *argv, "--out", str(out)]).startswith("error: " + message)
    assert not out.exists()
