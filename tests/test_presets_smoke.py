"""Every paper preset runs end to end at smoke scale through `fedhet reproduce`.

The preset modules were written against the `reproduce` layout (runs under `<out>/runs/`,
stages reading earlier stages' outputs); this is the check that they really fit together.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from fedhet.papers.base import PRESETS
from fedhet.papers.reproduce import reproduce


@pytest.mark.parametrize("paper", PRESETS.names())
def test_smoke_preset_runs_end_to_end(tmp_path: Path, paper: str):
    out = tmp_path / paper
    reproduce(paper, "smoke", out, jobs=2, stream=io.StringIO())
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["status"] == "finished" for r in rows), rows
    accuracies = [float(r["final_accuracy"]) for r in rows]
    assert max(accuracies) > 0.5  # something learned (10 classes: chance is 0.1)
    assert (out / "summary.md").exists() and (out / "report.md").exists()


def test_a_preset_whose_data_is_missing_fails_up_front_and_only_runs_the_rest(tmp_path, monkeypatch):
    """Paper scale offline: CIFAR-10 is not here, so `reproduce` stops before any run with one
    line naming the files and `--only` for the parts whose data is; `--only` runs just those."""
    import urllib.error

    from fedhet.data import download as dl
    from fedhet.errors import FedhetError
    from fedhet.papers import reproduce as rep
    from fedhet.runs.presets import Preset, RunSpec

    def refuse(*a, **k):
        raise urllib.error.URLError("offline")

    monkeypatch.setattr(dl.urllib.request, "urlopen", refuse)
    tiny = {"clients": 3, "rounds": 1, "model": "logreg", "local_steps": 1,
            "data_dir": str(tmp_path / "data")}
    specs = [RunSpec("digits-a", "g", "A", {**tiny, "dataset": "digits"}),
             RunSpec("cifar-a", "g2", "A", {**tiny, "dataset": "cifar10", "model": "cnn-cifar"})]
    with PRESETS.added("two-data", lambda scale: Preset("two-data", scale, [lambda out: specs])):
        out = tmp_path / "out"
        with pytest.raises(FedhetError) as err:
            rep.reproduce("two-data", "smoke", out, jobs=1)
        message = str(err.value)
        assert message.startswith("preset two-data (smoke) needs cifar10: CIFAR-10 files not found")
        assert message.endswith("run the parts whose data is here with --only digits")
        assert "\n" not in message and not out.exists()  # nothing made before the data check
        rep.reproduce("two-data", "smoke", out, jobs=1, only=("digits",))
        assert (out / "runs" / "digits-a" / "summary.json").is_file()
        assert not (out / "runs" / "cifar-a").exists()
