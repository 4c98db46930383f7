"""The user's own data: `from_arrays`, data files given by path (.npz, .csv, image folders), the
Hugging Face adapter; every partitioner and both executors on them; one clear line for a bad
file, with nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_errors import one_error_line
from PIL import Image
from sklearn.datasets import make_classification

from fedhet.cli import main
from fedhet.data.arrays import from_arrays
from fedhet.data.files import display_name
from fedhet.data.partition import PARTITIONS, partition_dataset
from fedhet.data.registry import DATASETS
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError

SRC = Path(__file__).resolve().parents[1] / "src"


def problem(n: int = 600, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A separable problem: logistic regression reaches well above chance in a few rounds."""
    return make_classification(
        n_samples=n, n_features=8, n_informative=6, n_redundant=0, n_classes=classes,
        class_sep=3.0, random_state=seed,
    )


def write_csv(path: Path, x: np.ndarray, labels, clients=None, label: str = "target") -> Path:
    names = [f"f{j}" for j in range(x.shape[1])]
    lines = [",".join(names + [label] + (["user"] if clients is not None else []))]
    for i, row in enumerate(x):
        cells = [f"{v:.6f}" for v in row] + [str(labels[i])]
        lines.append(",".join(cells + ([str(clients[i])] if clients is not None else [])))
    path.write_text("\n".join(lines) + "\n")
    return path


def load(path: Path | str, **values) -> object:
    """Load a dataset setting as a run does: parsed (made absolute), its options built."""
    cfg = config_of({"dataset": str(path), **{f"dataset.{k}": v for k, v in values.items()}})
    return DATASETS.get(cfg.dataset).factory(cfg.dataset_params, Path("."))


# --- from_arrays ------------------------------------------------------------------------------


def test_numpy_torch_and_lists_give_the_same_dataset():
    x, y = problem(60)
    y_test = [0, 1, 2, 1]
    a = from_arrays(x, y, x[:4], y_test)
    b = from_arrays(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(x[:4]), torch.tensor(y_test))
    c = from_arrays(x.tolist(), y.tolist(), x[:4].tolist(), y_test)
    for d in (b, c):
        assert torch.equal(d.x_train, a.x_train) and torch.equal(d.y_train, a.y_train)
        assert torch.equal(d.x_test, a.x_test) and torch.equal(d.y_test, a.y_test)
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    assert a.input_shape == (8,) and a.num_classes == 3 and a.natural_partition is None


def test_string_and_arbitrary_int_labels_are_numbered_in_sorted_order():
    x = np.arange(12, dtype=float).reshape(6, 2)
    d = from_arrays(x, ["dog", "cat", "emu", "cat", "dog", "emu"], x[:2], ["emu", "ant"])
    assert d.meta["classes"] == ["ant", "cat", "dog", "emu"] and d.num_classes == 4
    assert d.y_train.tolist() == [2, 1, 3, 1, 2, 3] and d.y_test.tolist() == [3, 0]
    d = from_arrays(x, [10, -3, 7, 7, 10, -3], x[:1], [7])
    assert d.meta["classes"] == [-3, 7, 10] and d.y_train.tolist() == [2, 0, 1, 1, 2, 0]
    d = from_arrays(x, [1, 0, 2, 2, 1, 0], x[:1], [2.0])  # already 0..C-1: kept
    assert d.y_train.tolist() == [1, 0, 2, 2, 1, 0] and d.meta["classes"] == [0, 1, 2]
    d = from_arrays(x, [1, 0, 1, 1, 1, 0], x[:1], [0], num_classes=5)  # classes 2..4 absent
    assert d.num_classes == 5 and d.y_train.tolist() == [1, 0, 1, 1, 1, 0]


def test_held_out_test_set_is_stratified_deterministic_and_disjoint():
    x, y = problem(500)
    x[:, 0] = np.arange(500)  # a sample's id, to trace where it went
    d = from_arrays(x, y, test_fraction=0.2, seed=3)
    for c in range(3):
        assert (d.y_test == c).sum() == round(0.2 * (y == c).sum())
    ids_tr, ids_te = d.x_train[:, 0].long(), d.x_test[:, 0].long()
    assert sorted(ids_tr.tolist() + ids_te.tolist()) == list(range(500))
    assert torch.equal(d.y_train, torch.from_numpy(y)[ids_tr])
    assert torch.equal(from_arrays(x, y, test_fraction=0.2, seed=3).x_test, d.x_test)
    assert not torch.equal(from_arrays(x, y, test_fraction=0.2, seed=4).x_test, d.x_test)


def test_client_ids_become_the_natural_partition_and_follow_the_kept_rows():
    x, y = problem(300)
    users = np.array([f"u{i % 7:02d}" for i in range(300)])
    x[:, 0] = np.arange(300)
    d = from_arrays(x, y, client_ids=users, seed=1)
    assert d.meta["client_ids"] == [f"u{k:02d}" for k in range(7)]
    parts = partition_dataset(d, "natural", 7, PARTITIONS.params("natural"), seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(d.y_train)))
    for k, part in enumerate(parts):
        rows = d.x_train[part, 0].long().numpy()
        assert (users[rows] == f"u{k:02d}").all()


def test_every_client_keeps_a_training_sample_after_the_hold_out():
    x, y = problem(200)
    d = from_arrays(x, y, client_ids=np.arange(200) // 2, test_fraction=0.9)
    assert len(d.natural_partition) == 100 and min(len(p) for p in d.natural_partition) >= 1


def test_natural_partition_with_the_wrong_client_count_says_how_many():
    x, y = problem(100)
    d = from_arrays(x, y, client_ids=np.arange(100) % 4, name="mine")
    with pytest.raises(FedhetError, match="split by its client ids into 4 clients; set clients=4"):
        partition_dataset(d, "natural", 5, PARTITIONS.params("natural"), seed=0)
    with pytest.raises(FedhetError, match="no natural partition.*client"):
        partition_dataset(from_arrays(x, y), "natural", 4, PARTITIONS.params("natural"), seed=0)


X, Y = np.ones((10, 3)), np.arange(10) % 2


@pytest.mark.parametrize(
    "args, kwargs, needle",
    [
        ((X, Y[:9]), {}, "x_train has 10 samples but y_train has 9 labels"),
        ((X, Y, X[:, :2], Y), {}, "x_test's have (2,)"),
        ((np.where(np.eye(10, 3) > 0, np.nan, X), Y), {}, "NaN or infinite value (sample 0)"),
        ((np.full((10, 3), np.inf), Y), {}, "NaN or infinite"),
        ((X.astype(str), Y), {}, "x_train is not numeric"),
        ((X, Y + 0.5), {}, "not a class; labels are integers or strings"),
        ((X, np.ones((10, 2))), {}, "one class label per sample"),
        ((X, Y), {"client_ids": [1, 2, 3]}, "client_ids has 3 entries but there are 10"),
        ((X[:0], Y[:0]), {}, "x_train is empty"),
        ((X, Y, X[:0], Y[:0]), {}, "x_test is empty"),
        ((X, Y, X), {}, "give both x_test and y_test"),
        ((X, Y), {"test_fraction": 1.5}, "test_fraction must lie strictly between 0 and 1"),
        ((X, Y), {"num_classes": 1}, "label 1 lies outside [0, num_classes=1)"),
        ((X, Y, X, Y.astype(str)), {}, "give both the same kind"),
    ],
)
def test_bad_arrays_are_one_line(args, kwargs, needle):
    with pytest.raises(FedhetError) as e:
        from_arrays(*args, **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


# --- every partitioner ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "label-per-client", "half-iid",
                                  "unbalanced", "natural"])
def test_every_partitioner_splits_an_own_dataset(name):
    x, y = problem(400, classes=4)
    labels = np.array(["north", "south", "east", "west"])[y]
    d = from_arrays(x, labels, client_ids=np.arange(400) % 8)
    parts = partition_dataset(d, name, 8, PARTITIONS.params(name), seed=0)
    assert len(parts) == 8 and all(len(p) > 0 for p in parts)
    everything = np.concatenate(parts)
    assert len(np.unique(everything)) == len(everything)
    assert everything.min() >= 0 and everything.max() < len(d.y_train)
    if name == "label-per-client":
        assert all(len(np.unique(d.train_labels[p])) == 1 for p in parts)


# --- files ------------------------------------------------------------------------------------


def test_csv_with_named_labels_client_column_and_a_test_file(tmp_path: Path):
    x, y = problem(120)
    names = np.array(["cat", "dog", "emu"])
    train = write_csv(tmp_path / "train.csv", x[:100], names[y[:100]], clients=np.arange(100) % 3)
    test = tmp_path / "test.csv"
    cols = [7, 3, 0, 1, 2, 4, 5, 6]  # the same columns in another order
    lines = [",".join(["target"] + [f"f{j}" for j in cols])]
    lines += [",".join([names[y[i]]] + [f"{x[i, j]:.6f}" for j in cols]) for i in range(100, 120)]
    test.write_text("\n".join(lines) + "\n")
    d = load(train, label="target", client="user", test=str(test))
    assert d.name == "train" and d.meta["classes"] == ["cat", "dog", "emu"]
    assert d.meta["client_ids"] == [0, 1, 2] and len(d.y_train) == 100 and len(d.y_test) == 20
    assert torch.allclose(d.x_test, torch.tensor(x[100:], dtype=torch.float32), atol=1e-5)
    assert torch.equal(d.y_test, torch.from_numpy(y[100:]))


def test_csv_labels_written_as_whole_floats_are_classes_in_numeric_order(tmp_path: Path):
    rows = "".join(f"{i},{c}.0\n" for i, c in enumerate([10, 2, 9] * 5))
    (tmp_path / "f.csv").write_text("a,label\n" + rows)
    d = load(tmp_path / "f.csv", test_fraction=0.2)
    assert d.meta["classes"] == [2, 9, 10]
    named = [d.meta["classes"][c] for c in d.y_train]
    assert named == [[10, 2, 9][int(a) % 3] for a in d.x_train[:, 0]]


def test_npz_with_and_without_a_test_part(tmp_path: Path):
    x, y = problem(100)
    np.savez(tmp_path / "a.npz", x_train=x[:80], y_train=y[:80], x_test=x[80:], y_test=y[80:],
             client_ids=np.array(["a", "b"])[np.arange(80) % 2])
    d = load(tmp_path / "a.npz")
    assert len(d.y_test) == 20 and d.meta["client_ids"] == ["a", "b"] and d.name == "a"
    np.savez(tmp_path / "b.npz", x_train=x.reshape(100, 2, 4), y_train=y)
    d = load(tmp_path / "b.npz", test_fraction=0.3)
    assert d.input_shape == (2, 4) and len(d.y_test) == sum(round(0.3 * (y == c).sum()) for c in range(3))


def image_folder(root: Path, sizes=((6, 5),), modes=("L",), per_class: int = 12) -> Path:
    """Two classes, dark and light, so a model can tell them apart."""
    rng = np.random.default_rng(0)
    for c, level in (("dark", 50), ("light", 200)):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            h, w = sizes[i % len(sizes)]
            mode = modes[i % len(modes)]
            shape = (h, w, 3) if mode == "RGB" else (h, w)
            pixels = np.clip(rng.normal(level, 20, shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).convert(mode).save(root / c / f"{i}.png")
    (root / "dark" / "notes.txt").write_text("not an image: skipped")
    return root


def test_image_folder_gray_and_colour(tmp_path: Path):
    d = load(image_folder(tmp_path / "gray"))
    assert d.name == "gray" and d.input_shape == (1, 6, 5) and d.meta["classes"] == ["dark", "light"]
    assert len(d.y_train) + len(d.y_test) == 24 and d.x_train.min() >= 0 and d.x_train.max() <= 1
    assert d.x_train[d.y_train == 0].mean() < 0.3 < 0.7 < d.x_train[d.y_train == 1].mean()
    d = load(image_folder(tmp_path / "mixed", modes=("L", "RGB")))
    assert d.input_shape == (3, 6, 5)  # one colour image makes every image RGB


def test_image_folder_resizes_on_request_and_reads_train_test_layout(tmp_path: Path):
    root = image_folder(tmp_path / "sizes", sizes=((6, 5), (9, 7)))
    with pytest.raises(FedhetError, match="set dataset.image_size=N"):
        load(root)
    assert load(root, image_size=4).input_shape == (1, 4, 4)
    image_folder(tmp_path / "split" / "train")
    image_folder(tmp_path / "split" / "test", per_class=3)
    d = load(tmp_path / "split")
    assert (len(d.y_train), len(d.y_test)) == (24, 6) and d.name == "split"


def test_huggingface_dataset_built_in_memory():
    datasets = pytest.importorskip("datasets")
    from fedhet.data.hf import from_huggingface

    x, y = problem(100)
    table = {f"f{j}": x[:, j] for j in range(8)} | {"label": y, "user": np.arange(100) % 5}
    features = datasets.Features({f"f{j}": datasets.Value("float64") for j in range(8)} | {
        "label": datasets.ClassLabel(names=["a", "b", "c", "unused"]),
        "user": datasets.Value("int64"),
    })
    ds = datasets.Dataset.from_dict(table, features=features)
    d = from_huggingface(ds, client="user", name="hf")
    assert d.input_shape == (8,) and d.num_classes == 4 and d.meta["classes"] == ["a", "b", "c", "unused"]
    assert len(d.natural_partition) == 5 and len(d.y_train) + len(d.y_test) == 100
    split = datasets.DatasetDict({"train": ds.select(range(80)), "test": ds.select(range(80, 100))})
    d = from_huggingface(split, features=["f0", "f1"])
    assert d.input_shape == (2,) and torch.equal(d.y_test, torch.from_numpy(y[80:]))
    assert torch.allclose(d.x_test[:, 1], torch.tensor(x[80:, 1], dtype=torch.float32))
    images = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(np.full((4, 3, 3), 10 * i, np.uint8)) for i in range(10)],
         "label": ["x", "y"] * 5},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("string")}),
    )
    d = from_huggingface(images, test_fraction=0.4)
    assert d.input_shape == (3, 4, 3) and d.meta["classes"] == ["x", "y"]
    with pytest.raises(FedhetError, match="no column 'target'.*label=COLUMN"):
        from_huggingface(ds, label="target")


# --- runs -------------------------------------------------------------------------------------


def run(out: Path, *args: str) -> dict:
    assert main(["run", *args, "-m", "logreg", "--set", "lr=0.5", "-r", "3", "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("executor", ["sequential", "stacked"])
def test_fedavg_learns_on_a_csv_and_an_npz(tmp_path: Path, executor: str):
    x, y = problem()
    csv = write_csv(tmp_path / "mine.csv", x, y)
    np.savez(tmp_path / "mine.npz", x_train=x, y_train=y)
    for data, extra in ((csv, ["--set", "dataset.label=target"]), (tmp_path / "mine.npz", [])):
        s = run(tmp_path / f"{data.suffix[1:]}-{executor}", "-d", str(data), "-n", "5",
                "--executor", executor, *extra)
        assert s["final_accuracy"] > 0.75, s  # chance is 1/3


def test_csv_natural_partition_by_its_client_column(tmp_path: Path, capsys):
    x, y = problem()
    csv = write_csv(tmp_path / "users.csv", x, y, clients=np.array(["ann", "bob", "cy"])[np.arange(600) % 3])
    s = run(tmp_path / "nat", "-d", str(csv), "--set", "dataset.label=target", "--set",
            "dataset.client=user", "-p", "natural", "-n", "3")
    assert s["final_accuracy"] > 0.75
    line = one_error_line(capsys, ["run", "-d", str(csv), "--set", "dataset.label=target", "--set",
                                   "dataset.client=user", "-p", "natural", "-n", "4", "-r", "1",
                                   "--out", str(tmp_path / "no")])
    assert "split by its client ids into 3 clients; set clients=3" in line
    assert not (tmp_path / "no").exists()


def test_a_relative_data_path_is_recorded_absolute_and_resumes_from_anywhere(tmp_path, monkeypatch):
    x, y = problem(200)
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "d.npz", x_train=x, y_train=y)
    monkeypatch.chdir(tmp_path / "data")
    out = tmp_path / "r"
    run(out, "-d", "d.npz", "-n", "2")
    saved = json.loads((out / "config.json").read_text())
    assert saved["dataset"] == str(tmp_path / "data" / "d.npz")
    assert display_name(saved["dataset"]) == "d" and display_name("digits") == "digits"
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--resume", str(out), "--rounds", "4"]) == 0
    assert json.loads((out / "summary.json").read_text())["rounds_done"] == 4


def bad_files(tmp: Path) -> list[tuple[list[str], str]]:
    """`(arguments, what the error line says)` for each kind of bad file."""
    header = "a,b,target\n"
    (tmp / "nolabel.csv").write_text("a,b,c\n1,2,0\n3,4,1\n")
    (tmp / "ragged.csv").write_text(header + "1,2,0\n3,4\n")
    (tmp / "text.csv").write_text(header + "1,2,0\n3,red,1\n")
    (tmp / "nan.csv").write_text(header + "1,2,0\n3,nan,1\n")
    (tmp / "empty-cell.csv").write_text(header + "1,,0\n3,4,1\n")
    (tmp / "regression.csv").write_text(header + "1,2,0\n3,4,1\n5,6,0.37\n")
    (tmp / "train.csv").write_text(header + "1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    (tmp / "test.csv").write_text("a,c,target\n1,2,0\n")
    np.savez(tmp / "nolabels.npz", x_train=np.ones((4, 2)))
    np.savez(tmp / "typo.npz", x_train=np.ones((4, 2)), y_train=np.arange(4), x_tset=np.ones((1, 2)))
    np.savez(tmp / "shape.npz", x_train=np.ones((4, 2)), y_train=np.arange(4), x_test=np.ones((2, 3)),
             y_test=np.arange(2))
    (tmp / "broken.npz").write_bytes(b"not a zip")
    np.savez(tmp / "objects.npz", x_train=np.ones((2, 2)), y_train=np.array([None, 1], dtype=object))
    image_folder(tmp / "imgs")
    (tmp / "imgs" / "light" / "bad.png").write_bytes(b"garbage")
    (tmp / "data.txt").write_text("1,2\n")
    label = ["--set", "dataset.label=target"]
    return [
        (["-d", str(tmp / "nolabel.csv")] + label, "nolabel.csv has no column 'target' for the labels "
                                                   "(columns: a, b, c); set dataset.label=COLUMN"),
        (["-d", str(tmp / "ragged.csv")] + label, "ragged.csv line 3 has 2 fields but the header has 3"),
        (["-d", str(tmp / "text.csv")] + label, "text.csv line 3, column 'b': 'red' is not a number"),
        (["-d", str(tmp / "nan.csv")] + label, "nan.csv line 3, column 'b' is nan, not a finite number"),
        (["-d", str(tmp / "empty-cell.csv")] + label, "empty-cell.csv line 2, column 'b' is empty"),
        (["-d", str(tmp / "regression.csv")] + label,
         "regression.csv line 4, column 'target': 0.37 is not a class"),
        (["-d", str(tmp / "train.csv"), "--set", f"dataset.test={tmp / 'test.csv'}"] + label,
         "test.csv's feature columns (a, c) differ from those of"),
        (["-d", str(tmp / "train.csv"), "--set", "dataset.client=user"] + label,
         "no column 'user' for the client ids"),
        (["-d", str(tmp / "nolabels.npz")], "nolabels.npz has no array 'y_train'"),
        (["-d", str(tmp / "typo.npz")], "typo.npz holds an array 'x_tset' that fedhet does not read"),
        (["-d", str(tmp / "shape.npz")],
         "shape.npz: x_train's samples have shape (2,) but x_test's have (3,)"),
        (["-d", str(tmp / "broken.npz")], "broken.npz is not a readable .npz file"),
        (["-d", str(tmp / "objects.npz")], "objects.npz holds an array of Python objects"),
        (["-d", str(tmp / "imgs")], "bad.png: cannot read the image"),
        (["-d", str(tmp / "missing.csv")], "missing.csv not found"),
        (["-d", str(tmp / "data.txt")], "fedhet reads .npz and .csv files and folders of images, not .txt"),
    ]


def test_each_bad_file_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, capsys):
    for args, needle in bad_files(tmp_path):
        out = tmp_path / "run"
        line = one_error_line(capsys, ["run", *args, "-r", "1", "--out", str(out)])
        assert needle in line, (needle, line)
        assert not out.exists()


def test_a_bad_file_from_the_command_line(tmp_path: Path):
    bad = tmp_path / "bad.csv"
    bad.write_text("x,label\n1,0\n2\n")
    r = subprocess.run(
        [sys.executable, "-m", "fedhet", "run", "-d", str(bad), "--out", str(tmp_path / "X")],
        capture_output=True, text=True, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {bad} line 3 has 1 fields but the header has 2; give every line 2 comma-separated values"
    ]
    assert not (tmp_path / "X").exists()
