"""`fedhet.run` and `fedhet.compare` take engine settings once, as keywords checked against
`RunConfig`'s fields: the typed keywords (`RunSettings`) are those fields, an unknown keyword is
one line naming the closest field, and a keyword setting makes the run `settings=` makes."""

from __future__ import annotations

import inspect
import json

import pytest

import fedhet
from fedhet import api
from fedhet.engine import ENGINE_FIELDS

QUIET = {"log": lambda _: None}


def test_the_typed_keywords_are_exactly_runconfigs_engine_fields():
    """`RunSettings` (for type checkers) and `ENGINE_FIELDS` (what a keyword is checked
    against at run time) list the same names: a field added to `RunConfig` without its
    keyword's type, or the reverse, fails here."""
    components = set(api.COMPONENT_KEYWORDS)
    assert set(api.RunSettings.__annotations__) == set(ENGINE_FIELDS) - components
    assert set(api.GridSettings.__annotations__) | set(api.RunSettings.__annotations__) == set(ENGINE_FIELDS)
    assert components <= set(ENGINE_FIELDS)


@pytest.mark.parametrize("function", [api.run, api.compare])
def test_no_own_parameter_shadows_a_setting(function):
    """A setting's keyword can always reach the settings: `run`'s and `compare`'s own
    parameters (`out`, `force`, `jobs`, ...) are no `RunConfig` field, except the component
    keywords `run` takes by position."""
    own = {name for name, p in inspect.signature(function).parameters.items()
           if p.kind is not inspect.Parameter.VAR_KEYWORD}
    assert own & set(ENGINE_FIELDS) <= set(api.COMPONENT_KEYWORDS)
    assert sum(p.kind is inspect.Parameter.VAR_KEYWORD
               for p in inspect.signature(function).parameters.values()) == 1


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"lrr": 0.1}, r"fedhet.run keyword: unknown setting 'lrr' \(did you mean 'lr'\?\)"),
        ({"learning_rate": 0.1}, r"unknown setting 'learning_rate' \(did you mean 'lr'\?\)"),
        ({"rnds": 3}, r"unknown setting 'rnds' \(did you mean 'rounds'\?\)"),
        ({"mu": 0.1}, r"unknown setting 'mu' \(did you mean 'algorithm.mu'\?\)"),
        ({"algorithm.mu": 0.1}, r"'algorithm.mu' is not a keyword setting.*settings=\{'algorithm.mu'"),
        ({"plugins": ["x"]}, r"'plugins' is not a keyword setting: keywords are RunConfig's fields"),
        ({"rounds": "many"}, "rounds must be an integer, got 'many'"),
    ],
)
def test_a_bad_keyword_is_one_line_naming_the_closest_field_and_writes_nothing(tmp_path, keywords,
                                                                              message):
    out = tmp_path / "never"
    with pytest.raises(fedhet.FedhetError, match=message) as caught:
        fedhet.run("fedprox", "digits", out=out, **QUIET, **keywords)
    assert "\n" not in str(caught.value)
    assert not out.exists()


def test_an_unknown_keyword_to_compare_is_refused_before_a_grid_is_made(tmp_path):
    out = tmp_path / "grid"
    with pytest.raises(fedhet.FedhetError, match=r"unknown setting 'clinets' \(did you mean 'clients'\?\)"):
        fedhet.compare(sweeps={"seed": [0]}, out=out, clinets=3)  # type: ignore[call-arg]
    with pytest.raises(fedhet.FedhetError, match="'rounds' is given both in base and as a keyword"):
        fedhet.compare(base={"rounds": 2}, sweeps={"seed": [0]}, out=out, rounds=3)
    assert not out.exists()


def _settings(run: fedhet.RunResult) -> dict:
    config = json.loads((run.dir / "config.json").read_text())
    return {k: v for k, v in config.items() if k not in ("provenance", "plugins")}


def test_keyword_settings_make_the_run_the_settings_mapping_makes(tmp_path):
    """Every engine field is a keyword: `lr=…, batch_size=…, local_steps=…` as keywords and as
    `settings={...}` give the same `config.json` (one parser reads both)."""
    given = {"clients": 3, "rounds": 1, "lr": 0.2, "batch_size": 8, "local_steps": 2,
             "momentum": 0.5, "eval_every": 1}
    by_keyword = fedhet.run("fedavg", "digits", out=tmp_path / "k", **QUIET, **given)
    by_mapping = fedhet.run("fedavg", "digits", out=tmp_path / "m", settings=given, **QUIET)
    assert _settings(by_keyword) == _settings(by_mapping)
    assert {k: by_keyword.config[k] for k in given} == given


def test_settings_win_over_a_keyword_as_set_wins_over_a_flag(tmp_path):
    r = fedhet.run("fedavg", "digits", clients=3, rounds=1, lr=0.3, settings={"lr": 0.01},
                   out=tmp_path / "r", **QUIET)
    assert r.config["lr"] == 0.01


def test_compare_keywords_are_settings_every_run_gets(tmp_path):
    rows = fedhet.compare(sweeps={"algorithm": ["fedavg", "fedprox"]}, dataset="digits", clients=3,
                          rounds=1, lr=0.2, out=tmp_path / "g", jobs=1)
    assert sorted(r["algorithm"] for r in rows) == ["fedavg", "fedprox"]
    configs = sorted((tmp_path / "g").glob("runs/*/config.json"))
    assert len(configs) == 2
    for path in configs:
        config = json.loads(path.read_text())
        assert (config["clients"], config["rounds"], config["lr"]) == (3, 1, 0.2)
