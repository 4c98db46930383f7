"""`fedhet partition`: the table matches the partition a run uses; heatmap; one-line errors."""

from __future__ import annotations

import gzip
import pickle
import urllib.error

import numpy as np
import pytest
from matplotlib import image as mpimg

from fedhet.cli import main
from fedhet.data import download as dl
from fedhet.data import images
from fedhet.data.partition import PARTITIONS, label_counts, partition_dataset
from fedhet.data.registry import DATASETS, load_dataset


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(url, *args, **kwargs):
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(dl.urllib.request, "urlopen", refuse)


def table(stdout: str) -> np.ndarray:
    """The `client size | counts...` rows as an array [client, size, counts...]."""
    rows = []
    for line in stdout.splitlines():
        left, bar, right = line.partition("|")
        if bar and left.split() and left.split()[0].isdigit():
            rows.append([int(v) for v in left.split()] + [int(v) for v in right.split()])
    return np.array(rows)


def expected_counts(dataset: str, partition: str, n: int, seed: int, data_dir="data", **values):
    data = load_dataset(dataset, DATASETS.params(dataset), data_dir)
    parts = partition_dataset(data, partition, n, PARTITIONS.params(partition, values), seed)
    return label_counts(data.train_labels, parts, data.num_classes)


def test_table_is_the_partition_and_heatmap_is_written(tmp_path, capsys):
    png = tmp_path / "plots" / "shards.png"
    argv = ["partition", "-d", "digits", "-p", "shards", "-n", "8", "--seed", "3",
            "--set", "partition.xi=2", "--heatmap", str(png)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = table(out)
    counts = expected_counts("digits", "shards", 8, 3, xi=2)
    np.testing.assert_array_equal(rows[:, 0], np.arange(8))
    np.testing.assert_array_equal(rows[:, 2:], counts)
    np.testing.assert_array_equal(rows[:, 1], counts.sum(axis=1))
    assert rows[:, 1].sum() == 1347
    assert "shards(xi=2, cut=sorted)" in out and "labels per client" in out and str(png) in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h, w = mpimg.imread(png).shape[:2]
    assert h > 200 and w > 400


def test_seed_changes_the_partition(capsys):
    assert main(["partition", "-d", "digits", "-p", "dirichlet", "-n", "5", "--seed", "0"]) == 0
    first = table(capsys.readouterr().out)
    assert main(["partition", "-d", "digits", "-p", "dirichlet", "-n", "5", "--seed", "1"]) == 0
    second = table(capsys.readouterr().out)
    assert first.shape == second.shape and not np.array_equal(first, second)


def _write_mnist(folder, n=200):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    y = np.arange(n) % 10
    data = ((x[:150].reshape(150, -1) / 256).astype(np.float32), y[:150]), \
        ((x[150:180].reshape(30, -1) / 256).astype(np.float32), y[150:180]), \
        ((x[180:].reshape(20, -1) / 256).astype(np.float32), y[180:])
    folder.mkdir(parents=True)
    with gzip.open(folder / "mnist.pkl.gz", "wb") as f:
        pickle.dump(data, f, protocol=2)


def test_case3_on_mnist_from_data_dir(tmp_path, capsys):
    _write_mnist(tmp_path / "mnist")
    argv = ["partition", "-d", "mnist", "-p", "half-iid", "-n", "5", "--data-dir", str(tmp_path)]
    assert main(argv) == 0
    rows = table(capsys.readouterr().out)
    assert rows[:, 1].sum() == 180
    assert rows[:3, 2 + 5:].sum() == 0 and rows[3:, 2:2 + 5].sum() == 0


def test_many_labels_list_the_largest(tmp_path, capsys):
    folder = tmp_path / "cifar100" / images.CIFAR100.batch_dir
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for name, n in (("train", 300), ("test", 10)):
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"fine_labels": (np.arange(n) % 100).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    argv = ["partition", "-d", "cifar100", "-p", "shards", "-n", "4", "--set", "partition.xi=20",
            "--data-dir", str(tmp_path), "--heatmap", str(tmp_path / "h.png")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "largest labels" in out and "300 train samples, 100 labels" in out
    assert (tmp_path / "h.png").is_file()


@pytest.mark.parametrize(("argv", "message"), [
    (["-p", "shards", "--set", "partition.xi=11"], "error: partition.xi=11 exceeds the 10 classes"),
    (["-p", "dirichlet", "--set", "partition.alpha=0"], "error: partition.alpha must be > 0"),
    (["-p", "iid", "-n", "5000"], "error: 5000 clients but only 1347 training samples"),
    (["-p", "nope"], "error: unknown partition 'nope'"),
    (["-d", "mnist", "-p", "iid", "--data-dir", "{tmp}"], "error: MNIST files not found in {tmp}/mnist"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["partition", "-d", "digits", *argv] if "-d" not in argv else ["partition", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.replace("{tmp}", str(tmp_path)))
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unwritable_heatmap_path(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["partition", "-d", "digits", "-n", "3", "--heatmap", str(blocker / "h.png")]) == 2
    assert capsys.readouterr().err.startswith("error: cannot save the heatmap")
