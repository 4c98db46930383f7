"""`--partition file`: a split another framework exported, read back exactly; every bad file is one
line saying what to fix; `fedhet partition --save-indices` writes what `file` reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_partitions import balanced, make_data

from fedhet.cli import main
from fedhet.data.index_map import read_index_map, write_index_map
from fedhet.data.partition import PARTITIONS, partition_dataset
from fedhet.engine import simulation
from fedhet.engine.config import config_of
from fedhet.engine.federation import federate
from fedhet.errors import FedhetError

DIGITS_TRAIN = 1347


def write(tmp_path, content) -> str:
    path = tmp_path / "split.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def read(path: str, n_clients: int, **values) -> list[np.ndarray]:
    """The `file` partition of 600 toy samples."""
    params = PARTITIONS.params("file", {"path": path, **values})
    return partition_dataset(make_data(balanced()), "file", n_clients, params, 0)


def as_lists(parts: list[np.ndarray]) -> list[list[int]]:
    return [p.tolist() for p in parts]


def test_object_form_is_read_back_exactly_in_client_order(tmp_path):
    mapping = {"2": [5, 599, 0], "0": [17, 3], "1": [42]}  # keys in any order, indices in any order
    parts = read(write(tmp_path, mapping), 3)
    assert as_lists(parts) == [[3, 17], [42], [0, 5, 599]]
    assert all(p.dtype == np.int64 for p in parts)


def test_list_form_and_unlisted_samples_are_unused(tmp_path):
    parts = read(write(tmp_path, [[9, 8, 7], [1], [300, 2]]), 3)
    assert as_lists(parts) == [[7, 8, 9], [1], [2, 300]]
    assert sum(map(len, parts)) == 6  # of 600 samples: the rest belong to no client


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf[[4], [2, 1]]")
    assert as_lists(read(str(path), 2)) == [[4], [1, 2]]


def test_seed_does_not_change_the_split(tmp_path):
    path = write(tmp_path, [[1, 2], [3]])
    params = PARTITIONS.params("file", {"path": path})
    runs = [partition_dataset(make_data(balanced()), "file", 2, params, seed) for seed in (0, 1, 99)]
    assert all(as_lists(r) == [[1, 2], [3]] for r in runs)


def test_overlap_only_when_allowed(tmp_path):
    path = write(tmp_path, {"0": [1, 2, 3], "1": [3, 4]})
    with pytest.raises(FedhetError, match="sample 3 is given to clients 0 and 1"):
        read(path, 2)
    assert as_lists(read(path, 2, allow_overlap="true")) == [[1, 2, 3], [3, 4]]


NOT_AN_INDEX = "not a sample index; indices are integers"


@pytest.mark.parametrize(("content", "n_clients", "message"), [
    ("{'0': [1]}", 1, r"is not valid JSON \(Expecting property name enclosed in double quotes at line 1"),
    ("", 1, "is not valid JSON"),
    ('"0,1,2"', 1, "holds a string; it must be an object"),
    ("7", 1, "holds a number; it must be an object"),
    ("{}", 1, "holds no clients"),
    ("[]", 1, "holds no clients"),
    ({"0": {"idx": [1]}}, 1, "client 0 maps to an object, not a list of sample indices"),
    ([[1], 2], 2, "client 1 maps to a number, not a list"),
    ({"0": [1], "1": [2.5]}, 2, f"client 1 lists 2.5, {NOT_AN_INDEX}"),
    ({"0": [1.0]}, 1, f"client 0 lists 1.0, {NOT_AN_INDEX}"),
    ({"0": ["4"]}, 1, f'client 0 lists "4", {NOT_AN_INDEX}'),
    ({"0": [True]}, 1, f"client 0 lists true, {NOT_AN_INDEX}"),
    ({"0": [None]}, 1, f"client 0 lists null, {NOT_AN_INDEX}"),
    ({"0": [1], "1": [600]}, 2, r"client 1 lists sample 600, outside \[0, 600\), the 600 training samples"),
    ({"0": [-1]}, 1, r"client 0 lists sample -1, outside \[0, N\)"),  # caught before the data loads
    ({"0": [2**70]}, 1, r"lists sample 1180591620717411303424, outside"),
    ({"0": [1, 2], "1": [7, 2]}, 2, "sample 2 is given to clients 0 and 1; .* partition.allow_overlap=true"),
    ({"0": [1, 5, 1]}, 1, "client 0 lists sample 1 twice; list each sample once"),
    ({"0": [1], "1": []}, 2, "client 1 has no samples; give every client at least one"),
    ([[1], [2], [3]], 4, "has 3 clients but --clients is 4; set --clients 3"),
    ({"0": [1], "2": [2]}, 2, r"keys of its 2 clients must be exactly 0..1 but 1 is missing"),
    ({"1": [1], "2": [2]}, 2, r"must be exactly 0..1 but 0 is missing"),
    ({"0": [1], "a": [2]}, 2, "key 'a' is not a client number"),
    ({"0": [1], "01": [2]}, 2, "key '01' is not a client number"),
    ({"0": [1], "-1": [2]}, 2, "key '-1' is not a client number"),
    ('{"0": [1], "1": [2], "1": [3]}', 2, "client 1 appears twice"),
])
def test_bad_file_says_what_is_wrong(tmp_path, content, n_clients, message):
    path = write(tmp_path, content)
    with pytest.raises(FedhetError, match=f"^partition.path={path}.*{message}") as e:
        read(path, n_clients)
    assert "\n" not in str(e.value)


def test_missing_unreadable_and_binary_files(tmp_path):
    with pytest.raises(FedhetError, match="nope.json: no such file"):
        PARTITIONS.params("file", {"path": str(tmp_path / "nope.json")})
    with pytest.raises(FedhetError, match=r"cannot read it \(Is a directory\)"):
        PARTITIONS.params("file", {"path": str(tmp_path)})
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(FedhetError, match="is not UTF-8 text"):
        PARTITIONS.params("file", {"path": str(binary)})
    with pytest.raises(FedhetError, match="needs partition.path=FILE.json"):
        PARTITIONS.params("file", {})
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.json"
        locked.write_text("[[1]]")
        locked.chmod(0)
        with pytest.raises(FedhetError, match=r"cannot read it \(Permission denied\)"):
            PARTITIONS.params("file", {"path": str(locked)})


def test_file_errors_are_caught_when_the_settings_are_built(tmp_path):
    """Everything that does not need the data is refused before any loading (and before a grid runs)."""
    with pytest.raises(FedhetError, match="client 0 lists sample 1 twice"):
        config_of({"partition": "file", "partition_params": {"path": write(tmp_path, [[1, 1]])}})


def settings(**extra) -> dict:
    return {"dataset": "digits", "clients": 4, "seed": 3, "rounds": 1, **extra}


@pytest.mark.parametrize("sets", [
    {"partition": "dirichlet", "partition.alpha": 0.3},
    {"partition": "shards"},
    {"partition": "dirichlet", "validation_fraction": 0.25},
], ids=str)
def test_round_trip_save_indices_then_file(tmp_path, capsys, sets):
    path = tmp_path / "out" / "split.json"
    argv = ["partition", "-d", "digits", "-n", "4", "--seed", "3", "--save-indices", str(path)]
    assert main(argv + [f"--set={k}={v}" for k, v in sets.items()]) == 0
    assert f"indices saved to {path}" in capsys.readouterr().out
    assert list(json.loads(path.read_text())) == ["0", "1", "2", "3"]

    cfg = config_of(settings(**sets))
    original = federate(cfg).parts
    kept = {k: v for k, v in sets.items() if not k.startswith("partition")}
    back = settings(**kept, seed=11, partition="file", **{"partition.path": str(path)})
    cfg = config_of(back)
    fed = federate(cfg)
    assert as_lists(fed.parts) == as_lists(original)
    assert sum(map(len, fed.parts)) == len(fed.data.y_train)
    assert (len(fed.data.y_train) < DIGITS_TRAIN) == ("validation_fraction" in sets)


def test_indices_count_in_the_training_set_left_after_the_validation_hold_out(tmp_path):
    """With validation_fraction, index j is the j-th training sample kept; the hold-out shrinks the range."""
    path = write(tmp_path, [[0], [DIGITS_TRAIN - 1]])
    whole = settings(partition="file", clients=2, partition_params={"path": path})
    cfg = config_of(whole)
    fed = federate(cfg)
    assert as_lists(fed.parts) == [[0], [DIGITS_TRAIN - 1]]
    cfg = config_of({**whole, "validation_fraction": 0.25})
    with pytest.raises(FedhetError, match=rf"sample {DIGITS_TRAIN - 1}, outside \[0, 1010\)"):
        federate(cfg)


def test_fedhet_run_trains_on_exactly_the_files_clients(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(0)
    chosen = rng.permutation(DIGITS_TRAIN)[:150]
    mapping = {str(i): sorted(chosen[i::3].tolist()) for i in range(3)}
    seen: list[list[list[int]]] = []
    init = simulation.Simulation.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(as_lists(self.side.partition))

    monkeypatch.setattr(simulation.Simulation, "__init__", spy)
    out = tmp_path / "run"
    argv = ["run", "-a", "fedavg", "-d", "digits", "-p", "file", "-n", "3", "-r", "2", "--quiet",
            "--set", f"partition.path={write(tmp_path, mapping)}", "--set", "lr=0.1", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert seen == [[mapping[str(i)] for i in range(3)]]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["rounds_done"] == 2
    assert json.loads((out / "config.json").read_text())["partition_params"]["allow_overlap"] is False


@pytest.mark.parametrize(("content", "n_clients", "message"), [
    ("[[1, 2], [2]]", "2", "sample 2 is given to clients 0 and 1"),
    ("[[1], [2]]", "3", "has 2 clients but --clients is 3; set --clients 2"),
    ('{"0": [1], "1": [5000]}', "2", r"client 1 lists sample 5000, outside [0, 1347)"),
    ("not json", "2", "is not valid JSON"),
])
def test_bad_file_through_the_cli_is_one_line_exit_2(tmp_path, capsys, content, n_clients, message):
    out = tmp_path / "run"
    path = write(tmp_path, content)
    argv = ["run", "-a", "fedavg", "-d", "digits", "-p", "file", "-n", n_clients, "-r", "1",
            "--set", f"partition.path={path}", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: partition.path={path}") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_missing_file_through_fedhet_partition(tmp_path, capsys):
    argv = ["partition", "-d", "digits", "-p", "file", "--set", f"partition.path={tmp_path}/x.json"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"error: partition.path={tmp_path}/x.json: no such file; give the JSON file of " \
                  "client → sample indices\n"


def test_read_index_map_matches_what_was_written(tmp_path):
    parts = [np.array([3, 1, 2]), np.array([0]), np.array([10, 4])]
    path = tmp_path / "deep" / "m.json"
    write_index_map(parts, path)
    assert path.read_text().splitlines()[1] == '"0": [3, 1, 2],'  # one client a line
    assert as_lists(read_index_map(str(path))) == [[1, 2, 3], [0], [4, 10]]


def test_resume_refuses_a_partition_file_edited_since_the_run_started(tmp_path, capsys):
    """Only the path is a setting; the checkpoint keeps a digest of the split, so a resume on an
    edited file is one line, exit 2, and the run's files are left as they were."""
    mapping = {str(i): list(range(i * 40, i * 40 + 40)) for i in range(3)}
    path = Path(write(tmp_path, mapping))
    out = tmp_path / "run"
    argv = ["run", "-a", "fedavg", "-d", "digits", "-p", "file", "-n", "3", "-r", "2", "--quiet",
            "--set", f"partition.path={path}", "--set", "lr=0.1", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    mapping["2"] = list(range(200, 240))
    path.write_text(json.dumps(mapping))
    assert main(["run", "--resume", str(out), "-r", "4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "data split differs" in err and err.count("\n") == 1 and "Traceback" not in err
    after = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    assert after == before
    mapping["2"] = list(range(80, 120))
    path.write_text(json.dumps(mapping))
    assert main(["run", "--resume", str(out), "-r", "4", "--quiet"]) == 0
