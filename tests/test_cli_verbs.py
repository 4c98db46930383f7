"""The command line as one module per verb: each verb's parser takes only its own flags (another
verb's flag is one line saying where it goes), `fedhet campaign run|plan` is the campaign, and
the old spellings `fedhet reproduce all|plan` run as them for one release with a one-line note."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cli_errors import one_error_line

from fedhet.cli import build_parser, leaf_parsers, main
from fedhet.cli.campaign import old_spelling

ROOT = Path(__file__).resolve().parents[1]
NOTE = "`fedhet reproduce plan` is now `fedhet campaign plan`"


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _leaf(*words: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return next(p for p in leaf_parsers(sub) if p.prog == " ".join(("fedhet", *words)))


def test_each_verb_takes_only_its_own_flags():
    campaign_only = {"--budget", "--cores", "--nice", "--cache", "--tables", "--results"}
    preset_only = {"--protocol", "--baselines", "--setup", "--only", "--jobs", "--set", "--algorithm"}
    reproduce, run, plan = _leaf("reproduce"), _leaf("campaign", "run"), _leaf("campaign", "plan")
    assert not campaign_only & _flags(reproduce) and preset_only <= _flags(reproduce)
    assert campaign_only <= _flags(run) and not preset_only & _flags(run)
    assert campaign_only - {"--budget", "--cores", "--nice"} <= _flags(plan)
    assert not {"--budget", "--cores", "--nice", "--data-dir"} & _flags(plan)
    assert not campaign_only & _flags(_leaf("compare")) and not campaign_only & _flags(_leaf("run"))


@pytest.mark.parametrize(("argv", "said"), [
    (["reproduce", "fednova", "--budget", "5"],
     "error: --budget goes with the campaign: `fedhet campaign run`"),
    (["reproduce", "fednova", "--tables=fedsr-mnist"], "error: --tables goes with the campaign"),
    (["campaign", "run", "--budget", "5", "-j", "2"],
     "error: --jobs: not an option of `fedhet campaign run`"),
    (["campaign", "plan", "--protocol", "fair"],
     "error: --protocol: not an option of `fedhet campaign plan`"),
    (["campaign", "plan", "--cores", "2"], "error: --cores: an option of a sitting (`fedhet campaign run`)"),
    (["campaign", "run", "--budget", "5", "--setup", "ref40"], "error: --setup goes with one paper's preset"),
    (["compare", "--budget", "5"], "error: unrecognized arguments: --budget 5 (see `fedhet compare --help`)"),
    (["campaign", "run"], "error: `fedhet campaign run` needs --budget MINUTES"),
    (["campaign"], "error: the following arguments are required: {run,plan} (see `fedhet campaign --help`)"),
])
def test_another_verbs_flag_is_one_line_saying_where_it_goes(capsys, tmp_path, argv, said):
    line = one_error_line(capsys, [*argv, *(["--results", str(tmp_path / "r")] if argv[0] == "campaign"
                                            and len(argv) > 1 else [])])
    assert line.startswith(said), line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("argv", "new"), [
    (["reproduce", "all", "--budget", "5"], ["campaign", "run", "--budget", "5"]),
    (["reproduce", "plan"], ["campaign", "plan"]),
    (["--threads", "1", "--plugin", "x.py", "reproduce", "--scale", "smoke", "all"],
     ["--threads", "1", "--plugin", "x.py", "campaign", "run", "--scale", "smoke"]),
    (["reproduce", "--device=cpu", "--quiet", "plan", "--tables", "a"],
     ["campaign", "plan", "--device=cpu", "--quiet", "--tables", "a"]),
    (["reproduce", "fedsr", "--scale", "plan"], ["reproduce", "fedsr", "--scale", "plan"]),
    (["reproduce", "fednova"], ["reproduce", "fednova"]),
    (["compare", "all"], ["compare", "all"]),
])
def test_the_old_spellings_are_read_as_the_new_ones(argv, new):
    got, note = old_spelling(argv)
    assert got == new
    assert bool(note) == (new != argv)


def test_reproduce_plan_prints_what_campaign_plan_prints_and_one_note(capsys, tmp_path):
    where = ["--results", str(ROOT / "results"), "--cache", str(tmp_path / "c"), "--tables",
             "fednnnn-mnist"]
    assert main(["campaign", "plan", *where]) == 0
    new = capsys.readouterr()
    assert main(["reproduce", "plan", *where]) == 0
    old = capsys.readouterr()
    assert "| fednnnn-mnist |" in new.out and old.out == new.out
    assert new.err == ""
    assert old.err.strip().splitlines() == [f"note: {NOTE}; the old spelling goes in the next "
                                            "release (docs/cli.md)"]


def test_an_old_spellings_error_is_still_one_line_and_names_the_new_spelling(capsys, tmp_path):
    line = one_error_line(capsys, ["reproduce", "plan", "--budget", "5", "--results", str(tmp_path)])
    assert line.startswith("error: --budget: an option of a sitting") and line.endswith(
        f"; note: {NOTE}; the old spelling goes in the next release (docs/cli.md)")


def test_reproduce_help_lists_the_registered_papers_and_campaign_help_none_of_the_presets(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    out = capsys.readouterr().out
    assert "papers (PAPER):" in out and "--budget" not in out
    from fedhet.papers import PAPERS
    from fedhet.papers.base import PRESETS

    for name in PAPERS:
        assert f"  {name:<10} {PRESETS.get(name).doc[:40]}" in out
    assert "protocol (--protocol fair): FedVeca's fair comparison" in " ".join(out.split())
    with pytest.raises(SystemExit):
        main(["campaign", "run", "--help"])
    out = capsys.readouterr().out
    assert "--budget MINUTES" in out and "--protocol" not in out and "papers (PAPER)" not in out
