"""The `bherd` preset and the Fig. 4 plots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedhet.engine.config import config_of
from fedhet.errors import FedhetError
from fedhet.papers.base import PRESETS
from fedhet.papers.bherd import plots as plots_bherd
from fedhet.papers.bherd.preset import METHODS
from fedhet.runs.single import execute


def specs(scale: str):
    preset = PRESETS.get("bherd").factory(scale)
    return [s for stage in preset.stages for s in stage(Path("unused"))]


@pytest.mark.parametrize("scale", ["smoke", "small", "paper"])
def test_preset_covers_the_paper_grid(scale):
    runs = specs(scale)
    assert len({r.name for r in runs}) == len(runs)
    main = [r for r in runs if r.name.startswith("main-")]
    n_setups = {"smoke": 1, "small": 1, "paper": 3}[scale]
    n_seeds = {"smoke": 1, "small": 1, "paper": 10}[scale]  # the paper averages 10 runs
    assert len(main) == n_setups * 3 * len(METHODS) * n_seeds
    assert len({r.settings["seed"] for r in runs}) == n_seeds
    assert {r.settings["partition"] for r in main} == {"iid", "label-per-client", "half-iid"}
    for r in runs:
        cfg = config_of(r.settings, r.name)  # every key is a valid setting
        assert cfg.clients >= 5
    alphas = {r.settings.get("algorithm.alpha") for r in runs if r.name.startswith("alpha-")}
    assert alphas == {0.1, 0.3, 0.5, 1.0}
    epochs = {r.settings["local_epochs"] for r in runs if r.name.startswith("epochs-")}
    assert epochs == {0.1, 0.5, 1.0, 2.0}
    orders = {r.settings["algorithm.order"] for r in runs if r.name.startswith("order-")}
    assert orders == {"fixed", "reshuffle"}
    if scale == "paper":
        assert {r.settings["rounds"] for r in runs} == {100}
        assert {r.settings["model"] for r in main} == {"svm", "cnn-mnist"}
        assert {r.settings["dataset"] for r in main} == {"mnist-even-odd", "mnist", "cifar10"}


def test_plots_from_a_bherd_run(tmp_path):
    run = tmp_path / "run"
    settings = {"algorithm": "bherd", "dataset": "digits", "partition": "iid", "clients": 3,
                "rounds": 3, "lr": 0.1, "batch_size": 64, "algorithm.alpha": 0.3}
    execute(settings, run, log=lambda m: None)
    kept = plots_bherd.read_kept(run)
    grid = plots_bherd.kept_matrix(kept, 0)
    tau = 449 // 64
    assert grid.shape[1] == 3 and grid.shape[0] <= tau
    assert np.all(grid.sum(0) == int(0.3 * tau))
    for path in (plots_bherd.kept_index_map(run),
                 plots_bherd.herd_distance([run, run], tmp_path / "d.png"),
                 plots_bherd.curves({"BHerd": run}, tmp_path / "c.png")):
        assert path.exists() and path.read_bytes()[:4] == b"\x89PNG"
    fedavg = tmp_path / "fedavg"
    plain = {k: v for k, v in settings.items() if not k.startswith("algorithm.")}
    execute({**plain, "algorithm": "fedavg", "rounds": 1}, fedavg, log=lambda m: None)
    with pytest.raises(FedhetError, match="BHerd"):
        plots_bherd.herd_distance([fedavg], tmp_path / "x.png")


def fake_run(path: Path, acc: list[float], kept: list[list[int]]) -> None:
    from fedhet.rundir.store import RunStore

    store = RunStore(path)
    rows = [{"round": k, "test_loss": 1.0 - a, "test_accuracy": a,
             **({"herd_dist_0": 0.1 / k} if k else {})} for k, a in enumerate(acc)]
    store.write_metrics(rows)
    store.write_diagnostics([{"round": k + 1, "kept_indices": {"0": v}} for k, v in enumerate(kept)])


def test_main_report_table_counts_rounds_to_fedavgs_final_accuracy(tmp_path):
    from fedhet.papers.bherd.preset import main_runs

    for spec in main_runs("smoke"):
        acc = [0.1, 0.5, 0.7, 0.8] if spec.label == "BHerd-FedAvg" else [0.1, 0.4, 0.6, 0.7]
        fake_run(tmp_path / spec.name, acc, [[0, 2], [1, 2], [0, 3]])
    table, pngs = plots_bherd.main_report(tmp_path, "smoke", "logreg-digits", tmp_path / "rep")
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line.split("|")[6].strip()
            for line in table.splitlines()[2:]}
    assert rows[("case1", "BHerd-FedAvg")] == "2" and rows[("case3", "FedAvg")] == "3"
    assert rows[("case2", "Centralized")] == "—"
    assert len(pngs) == 7 and all(p.exists() for p in pngs)


# -- the multi-seed study (papers/bherd/readings.py) --------------------------------
def test_study_methods_have_distinct_directories_and_valid_settings():
    from fedhet.engine.config import config_of
    from fedhet.papers.bherd import readings as br

    for study in (s for s in br.STUDIES if s not in br.NEW_STUDIES):
        table = br.methods(study, "sum")
        assert len({br.slug(m) for m in table.values()}) == len(table)
        assert br.FEDAVG in table
        for method in table.values():
            cfg = config_of(br.settings("case3", method, 7))
            assert (cfg.rounds, cfg.clients, cfg.batch_size, cfg.lr, cfg.seed) == (100, 5, 50, 0.01, 7)
            assert cfg.partition == "half-iid" and cfg.model == "svm"
    assert br.parse_seeds("0-2,5") == [0, 1, 2, 5]
    scaffold = br.methods("scaffold", "mean-tau")
    assert scaffold[br.SCAFFOLD] == {"algorithm": "scaffold"}
    guarded = scaffold["BHerd-SCAFFOLD mean-tau ρ=1.0"]
    cfg = config_of(br.settings("case2", guarded, 0))
    assert cfg.algorithm == "bherd-scaffold" and cfg.partition == "label-per-client"
    assert (cfg.algorithm_params.alpha, cfg.algorithm_params.max_herd_error) == (0.5, 1.0)


@pytest.fixture
def br(monkeypatch):
    """The study module with tiny settings: logistic regression on digits, 3 clients, 5 rounds."""
    from fedhet.papers.bherd import readings

    tiny = {"dataset": "digits", "model": "logreg", "clients": 3, "rounds": 5, "lr": 0.1,
            "batch_size": 32, "local_epochs": 1.0}
    monkeypatch.setattr(readings, "settings", lambda case, method, seed: {
        **tiny, "partition": readings.CASES[case], "seed": seed, **method})
    return readings


def test_study_runs_resume_and_reports(tmp_path, br):
    logged: list[str] = []
    br.run_study(tmp_path, "grab", [0, 1], "mean-tau", ["case1"], log=logged.append)
    assert len(logged) == 6 and all("finished" in line for line in logged)
    commits = (tmp_path / "commits.jsonl").read_text().splitlines()
    br.run_study(tmp_path, "grab", [0, 1], "mean-tau", ["case1"], log=logged.append)
    assert len(logged) == 6  # finished runs are skipped
    assert (tmp_path / "commits.jsonl").read_text().splitlines() == commits
    table = br.report(tmp_path, "grab", "mean-tau", ["case1"]).splitlines()
    rows = {line.split("|")[2].strip(): line for line in table[2:]}
    assert set(rows) == {"FedAvg", "GraB-FedAvg", "GraB-FedAvg crop α=0.5 mean-tau"}
    assert "| 2 |" in rows["GraB-FedAvg"] and " ± " in rows["GraB-FedAvg"]
    one = br.report(tmp_path, "grab", "mean-tau", ["case1"], seeds=[1], baseline="GraB-FedAvg")
    assert "vs GraB-FedAvg" in one.splitlines()[0]
    assert all("| 1 |" in line for line in one.splitlines()[2:])


def test_paired_difference_marks_only_what_is_outside_the_noise():
    from fedhet.papers.bherd.readings import paired

    assert paired([0.1, 0.11, 0.09]).endswith("*")  # mean 0.1, std 0.01: far outside 2 SE
    assert not paired([0.1, -0.1, 0.05]).endswith("*")
    assert paired([0.1]) == "—"


def test_scaffold_study_runs_and_reports_the_guard(tmp_path, br):
    logged: list[str] = []
    br.run_study(tmp_path, "scaffold", [0, 1], "mean-tau", ["case3"], log=logged.append)
    assert len(logged) == 6 and all("finished" in line for line in logged)
    table = br.report(tmp_path, "scaffold", "mean-tau", ["case3"], baseline=br.SCAFFOLD)
    rows = {line.split("|")[2].strip(): line for line in table.splitlines()[2:]}
    assert set(rows) == {"FedAvg", "SCAFFOLD", "BHerd-SCAFFOLD mean-tau ρ=1.0"}
    assert "vs SCAFFOLD" in table.splitlines()[0]
    guard = br.guard_report(tmp_path, "scaffold", "mean-tau", ["case3"]).splitlines()
    assert len(guard) == 3 and "| case3 | BHerd-SCAFFOLD mean-tau ρ=1.0 | 2 |" in guard[2]


def test_guard_report_counts_fallbacks(tmp_path):
    import json

    from fedhet.papers.bherd import readings as br
    from fedhet.rundir.store import RunStore

    method = br.methods("scaffold", "mean-tau")["BHerd-SCAFFOLD mean-tau ρ=1.0"]
    for seed, fallbacks in ((0, [0, 2, 0, 1, 0]), (1, [0, 0, 0, 0, 0])):
        out = br.run_dir(tmp_path, "case2", method, seed)
        out.mkdir(parents=True)
        RunStore(out).write_metrics([
            {"round": k, "test_loss": 0.3, "test_accuracy": 0.8,
             "herd_fallbacks": fallbacks[k - 1] if k else float("nan")} for k in range(6)])
        (out / "summary.json").write_text(json.dumps({"status": "finished"}))
    lines = br.guard_report(tmp_path, "scaffold", "mean-tau", ["case2"]).splitlines()
    assert lines[2] == ("| case2 | BHerd-SCAFFOLD mean-tau ρ=1.0 | 2 | 1.5 ± 2.1 | 1/2 | 2.0 | 4.0 "
                        "| 1.0 ± 1.4 |")


def test_studies_pair_against_fedavg_of_the_same_setup():
    """2a-2c: the first method is FedAvg in the study's setup; ref40 runs get reference [40]'s
    settings, the batch study the paper's best B per case (Case 3's B = 50 run is the default
    run's directory, so it is shared with the other studies)."""
    from fedhet.engine.config import config_of
    from fedhet.papers.bherd import readings as br

    for study in br.NEW_STUDIES:
        table = br.methods(study, "mean-tau")
        first = next(iter(table.values()))
        assert first["algorithm"] == "fedavg"
        for case in br.CASES:
            assert len({br.slug(m, case) for m in table.values()}) == len(table)
            for method in table.values():
                cfg = config_of(br.settings(case, method, 3))
                assert cfg.train_loss and cfg.seed == 3 and cfg.model == "svm"
                if study == "ref40":
                    assert (cfg.batch_size, cfg.lr) == (100, 0.01)
                    assert cfg.dataset_params.normalize is False
                    assert (cfg.model_params.bias, cfg.model_params.init) == (False, "zeros")
                elif study == "batch":
                    assert cfg.batch_size == {"case1": 10, "case2": 10, "case3": 50}[case]
    crit = br.methods("criterion", "mean-tau")
    assert crit["BHerd mean-tau grab-stale"]["algorithm.criterion"] == "grab-stale"
    best = br.methods("batch", "mean-tau")["BHerd mean-tau B=best"]
    assert br.slug(best, "case3") == br.slug(br.bherd("mean-tau"), "case3")
    assert br.slug(best, "case1").endswith("-B10")


def _fake_run(d, acc, train, kept=None):
    """A finished run directory: rounds 0–12 with the given per-round accuracy/training loss."""
    import json

    d.mkdir(parents=True)
    head = "round,test_loss,test_accuracy,train_loss" + (",kept_0" if kept is not None else "")
    lines = [head] + [f"{k},0.3,{acc(k)},{train(k)}" + (f",{kept}" if kept is not None else "")
                      for k in range(13)]
    (d / "metrics.csv").write_text("\n".join(lines) + "\n")
    (d / "summary.json").write_text(json.dumps({"status": "finished", "finished": True}))
    (d / "config.json").write_text(json.dumps({"seed": int(d.name[4:]), "clients": 1}))


def test_paired_report_and_export_by_hand(tmp_path):
    """Three seeds; BHerd's accuracy is FedAvg's + 0.01·(1, 2, 3) in every round (mean Δ 0.02,
    std 0.01, 2·std/√3 = 0.0115: outside the noise) and its training loss FedAvg's
    + (0.1, −0.1, 0) (mean 0, inside)."""
    from fedhet.papers.bherd import export
    from fedhet.papers.bherd import readings as br
    from fedhet.papers.paper_results import read_results

    table = br.methods("criterion", "mean-tau")
    fedavg, herd = table["FedAvg"], table["BHerd mean-tau"]
    for s in range(3):
        _fake_run(br.run_dir(tmp_path, "case3", fedavg, s), lambda k: 0.5 + k / 100, lambda k: 1 - k / 20)
        _fake_run(br.run_dir(tmp_path, "case3", herd, s), lambda k, s=s: 0.51 + s / 100 + k / 100,
                  lambda k, s=s: 1 - k / 20 + (0.1, -0.1, 0.0)[s], kept=7)
    text = br.paired_report(tmp_path, "criterion", "mean-tau", cases=["case3"])
    row = next(line for line in text.splitlines() if "| BHerd mean-tau |" in line)
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2] == "3"
    assert cells[3] == "0.6400 ± 0.0100"  # final acc at round 12: 0.63, 0.64, 0.65
    assert cells[7] == "+0.0200 ± 0.0100 *"  # Δ final acc
    assert cells[9] == "+0.0200 ± 0.0100 *"  # Δ acc r1–10
    assert cells[8] == "+0.0000 ± 0.1000"  # Δ final train loss, inside the noise
    rows, missing = export.study_rows(tmp_path, "criterion", "mean-tau", range(3))
    assert len(missing) == 3 * 3 * 3 - 6  # the other cases and the grab-stale method
    out = tmp_path / "svm-criterion.csv"
    from fedhet.papers.paper_results import write_rows

    write_rows(out, rows, ("kept_steps",))
    curves = read_results(out)
    assert set(curves) == {("case3", "fedavg"), ("case3", "bherd")}
    assert curves[("case3", "bherd")][2]["test_accuracy"][12] == pytest.approx(0.65)
    assert export.algorithm_label({**herd, "algorithm.criterion": "grab-stale", "_setup": "ref40"},
                                  "case1") == "bherd[criterion=grab-stale,ref40]"
    assert export.algorithm_label(br.methods("batch", "mean-tau")["FedAvg B=best"], "case2") \
        == "fedavg[B=10]"


def test_preset_svm_runs_use_reference_40s_setup_and_cnns_keep_theirs():
    from fedhet.engine.config import config_of
    from fedhet.papers.bherd.preset import main_runs, sensitivity_runs

    runs = main_runs("paper") + sensitivity_runs("paper")
    svm = [config_of(r.settings) for r in runs if r.settings["model"] == "svm"]
    cnn = [config_of(r.settings) for r in runs if r.settings["model"] != "svm"]
    assert svm and cnn
    for cfg in svm:
        assert (cfg.model_params.bias, cfg.model_params.init, cfg.lr) == (False, "zeros", 0.01)
        assert cfg.dataset_params.normalize is False and cfg.train_loss
    assert {c.batch_size for c in svm} == {10, 20, 50, 100}  # 100, and the B sweep
    assert {c.batch_size for c in cnn} == {50}


def test_a_setup_study_report_names_its_baselines_with_the_setup(tmp_path):
    """Under `--setup ref40` every label carries the setup (`FedAvg ref40`): the report takes the
    plain names for them (the default baseline FedAvg too) and refuses a name of no method."""
    from fedhet.papers.bherd.readings import report

    table = report(tmp_path, "alpha", "mean-tau", seeds=[0], setup="ref40",
                   baseline="BHerd mean-tau α=1.0")
    assert "Δ final acc vs BHerd mean-tau α=1.0 |" in table  # was a KeyError under a setup
    assert "Δ final acc vs FedAvg |" in report(tmp_path, "alpha", "mean-tau", setup="ref40")
    with pytest.raises(FedhetError, match="--baseline 'nope'.*FedAvg ref40"):
        report(tmp_path, "alpha", "mean-tau", setup="ref40", baseline="nope")


def test_the_methods_study_fills_the_pages_fig2_claims(tmp_path):
    """The `methods` study in [40]'s setup, exported, gives docs/paper-scale.md its rows for
    "GraB-FedAvg falls short", "BHerd improves FedNova" and "BHerd improves SCAFFOLD", each
    BHerd method paired with its own baseline of the same setup. By hand (3 seeds, early loss
    = the training loss over rounds 1–10): FedNova 0.30 + 0.01·s, BHerd-FedNova 0.10 lower
    (faster: holds); SCAFFOLD 0.30, BHerd-SCAFFOLD 0.05 higher (fails); GraB-FedAvg equal to
    FedAvg but for ±0.01 (inside the noise: "falls short" holds)."""
    from fedhet.papers import paper_results as pr
    from fedhet.papers import paper_scale as ps
    from fedhet.papers.bherd import export
    from fedhet.papers.bherd import readings as br

    table = br.methods("methods", "mean-tau", "ref40")
    loss = {"FedAvg ref40": 0.3, "BHerd mean-tau ref40": 0.3, "GraB-FedAvg ref40": 0.3,
            "FedNova ref40": 0.3, "BHerd-FedNova ref40": 0.2, "SCAFFOLD ref40": 0.3,
            "BHerd-SCAFFOLD mean-tau ref40": 0.35}
    assert set(table) == set(loss)
    root = tmp_path / "study"
    for label, method in table.items():
        for s in range(3):
            wobble = (0.01, -0.01, 0.0)[s] if label.startswith("GraB") else 0.0
            _fake_run(br.run_dir(root, "case2", method, s), lambda k: 0.8,
                      lambda k, v=loss[label] + 0.01 * s + wobble: 1.0 if k == 0 else v)
    rows, _ = export.study_rows(root, "methods", "mean-tau", range(3), "ref40")
    results = tmp_path / "results"
    pr.write_rows(results / "bherd" / "svm-methods-ref40.csv", rows, ("kept_steps",))
    pr.write_meta(results / "bherd" / "svm-methods-ref40.json", "svm-methods-ref40", "bherd", "cmd",
                  "cpu: test", 1.0, [0, 1, 2])
    page = ps.render(ps.load(results))
    line = {claim: [x for x in page.splitlines() if claim in x] for claim in (
        "BHerd improves FedNova", "BHerd improves SCAFFOLD", "GraB-FedAvg falls short")}
    (nova,), (scaffold,), (grab,) = line.values()
    assert "bherd-fednova[ref40] vs fednova[ref40]" in nova and "| **yes** |" in nova
    assert "Δ early loss -0.1000 ± 0.0000 *" in nova  # rounds 1–10: (0.2 + 0.01·s) − (0.3 + 0.01·s)
    assert "bherd-scaffold[ref40] vs scaffold[ref40]" in scaffold and "| **no** |" in scaffold
    assert "grab-fedavg[ref40] vs fedavg[ref40]" in grab and "| **yes** |" in grab
