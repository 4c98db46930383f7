"""Provenance (`fedhet.provenance`): every run's config.json and summary.json say what made it,
and those record keys are no settings (a resume reads and compares the saved config)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy
import pytest
import torch

import fedhet
from fedhet import plugins
from fedhet import provenance as prov
from fedhet.engine.config import RECORD_KEYS, canonical_config, config_of, parse
from fedhet.runs.single import execute

KEYS = {"fedhet", "commit", "dirty", "torch", "numpy", "python", "device", "plugins"}
SETTINGS = {"dataset": "digits", "clients": 4, "rounds": 2, "device": "cpu"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run made with no plugin loaded (another test file's plugins, loaded in this process
    earlier, are set aside while it runs)."""
    out = tmp_path_factory.mktemp("prov") / "run"
    loaded = dict(plugins._LOADED)
    plugins._LOADED.clear()
    try:
        execute(SETTINGS, out, log=lambda _: None)
    finally:
        plugins._LOADED.update(loaded)
    return out


def test_config_and_summary_record_the_provenance(run):
    config = json.loads((run / "config.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    for record in (config["provenance"], summary["provenance"]):
        assert set(record) == KEYS
        assert record["fedhet"] == fedhet.__version__ and record["torch"] == torch.__version__
        assert record["numpy"] == numpy.__version__ and record["device"] == "cpu"
        assert record["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", record["commit"])
        assert record["dirty"] in (None, True, False)
        assert (record["commit"] is None) == (record["dirty"] is None)
    assert config["plugins"] == [] and config["provenance"]["plugins"] == {}


def test_the_record_keys_are_no_settings(run):
    saved = json.loads((run / "config.json").read_text())
    settings = {k: v for k, v in saved.items() if k not in RECORD_KEYS}
    assert parse(saved, "config.json") == parse(settings, "config.json")
    assert canonical_config(saved) == config_of(SETTINGS).to_dict()
    broken = {**saved, "algorithm": "no-such-method"}  # kept as saved, less the record
    assert set(canonical_config(broken)) == set(settings)


def test_a_run_whose_config_has_the_record_resumes(run, tmp_path):
    summary = execute({"rounds": 3}, run, resume=True, log=lambda _: None)
    assert summary["rounds_done"] == 3 and summary["finished"]
    assert set(json.loads((run / "config.json").read_text())["provenance"]) == KEYS


def test_the_commit_is_the_checkouts_head(monkeypatch):
    root = Path(fedhet.__file__).resolve().parent.parent.parent
    if not (root / ".git").exists():
        pytest.skip("fedhet is not run from a checkout here")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    prov.git_state.cache_clear()
    assert prov.git_state()[0] == head


def test_no_checkout_or_a_git_that_does_not_answer_gives_none(tmp_path, monkeypatch):
    site = tmp_path / "site-packages" / "fedhet"
    site.mkdir(parents=True)
    (tmp_path / ".git").mkdir()  # a repository around the environment is not fedhet's checkout
    assert prov._checkout_root(site) is None

    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], prov.GIT_TIMEOUT_S)

    monkeypatch.setattr(prov.subprocess, "run", hangs)
    prov.git_state.cache_clear()
    try:
        assert prov.git_state() == (None, None)
        assert prov.provenance("cpu")["commit"] is None
    finally:
        prov.git_state.cache_clear()
