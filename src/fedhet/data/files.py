"""A dataset given by its path (`fedhet run -d mydata.csv`): a `.npz` or `.csv` file, or a
folder of images with one subfolder per class (docs/data.md).

`resolve` is a resolver of `DATASETS`: a `dataset` setting that is no registered name but a
path becomes an entry whose factory reads that file, with the options of its format as its
parameters (`dataset.label`, `dataset.client`, ...). Every format goes through `from_arrays`,
so its checks hold for files too; each problem is one `FedhetError` line naming the file (and
the line and column, or the image) and the fix.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.data.arrays import from_arrays
from fedhet.data.base import Dataset
from fedhet.data.registry import DATASETS
from fedhet.errors import FedhetError
from fedhet.registry import Entry

SUFFIXES = (".npz", ".csv")
IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)
GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F"})
NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test", "client_ids")


def is_data_path(value: str) -> bool:
    """Whether a `dataset` value names a file rather than a registered dataset: it ends in
    `.npz` or `.csv`, holds a path separator, or exists on disk."""
    return (
        Path(value).suffix.lower() in SUFFIXES or _pathy(value) or Path(value).expanduser().exists()
    )


def _pathy(name: str) -> bool:
    return "/" in name or os.sep in name


def absolute(value: str) -> str:
    """A path as the absolute path config.json records, so `--resume` from any directory finds
    the file."""
    return str(Path(value).expanduser().resolve())


def display_name(dataset: str) -> str:
    """How tables, summaries and run directory names show a `dataset` setting: a data file's
    stem (`/home/me/mydata.csv` → `mydata`, a folder's name), else the setting itself."""
    return Path(dataset).stem if _pathy(dataset) else dataset


@dataclass(frozen=True)
class SplitParams:
    test_fraction: float = 0.2
    """Share of each class held out as the test set when the file has no test part."""
    split_seed: int = 0
    """Fixes that hold-out (not the run's seed: every run of a grid sees the same split)."""

    def validate(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise FedhetError(f"dataset.test_fraction must lie in (0, 1), got {self.test_fraction}")


@dataclass(frozen=True)
class _TestFile:
    test: str = ""
    """A separate test file or folder of the same format; relative to the working directory."""

    def __post_init__(self) -> None:
        # recorded absolute (config.json), as the dataset path itself, so a resume finds it
        if self.test:
            object.__setattr__(self, "test", absolute(self.test))


@dataclass(frozen=True)
class NpzParams(SplitParams):
    """Options of a `.npz` file (its arrays say the rest)."""


@dataclass(frozen=True)
class CsvParams(SplitParams, _TestFile):
    label: str = "label"
    """The column of class labels (integers or names)."""
    client: str = ""
    """The column of client ids (each sample's user or device), for `--partition natural`."""


@dataclass(frozen=True)
class ImageFolderParams(SplitParams, _TestFile):
    image_size: int = 0
    """Resize every image to `image_size × image_size` (0: keep the size, which all must share)."""

    def validate(self) -> None:
        super().validate()
        if self.image_size < 0:
            raise FedhetError(f"dataset.image_size must be ≥ 0, got {self.image_size}")


@contextlib.contextmanager
def about(path: Path | str) -> Iterator[None]:
    """Prefix the `FedhetError`s of the block with the file they concern."""
    try:
        yield
    except FedhetError as e:
        if str(path) in str(e):
            raise
        raise FedhetError(f"{path}: {e}") from None


# --- .npz -------------------------------------------------------------------------------------


def load_npz(path: Path, params: NpzParams) -> Dataset:
    """Arrays `x_train`, `y_train`, optional `x_test` and `y_test`, optional `client_ids`."""
    if not zipfile.is_zipfile(path):
        raise FedhetError(
            f"{path} is not a readable .npz file (not a zip archive); write it with numpy.savez"
        )
    try:
        with np.load(path, allow_pickle=False) as f:
            names = list(f.files)
            unknown = [n for n in names if n not in NPZ_ARRAYS]
            if unknown:
                raise FedhetError(
                    f"{path} holds an array {unknown[0]!r} that fedhet does not read; name the arrays "
                    f"{', '.join(NPZ_ARRAYS)} (the last three optional)"
                )
            for need in ("x_train", "y_train"):
                if need not in names:
                    raise FedhetError(
                        f"{path} has no array {need!r} (it holds {', '.join(names) or 'none'}); save "
                        "it with numpy.savez(path, x_train=..., y_train=...)"
                    )
            arrays = {n: f[n] for n in names}
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise FedhetError(
                f"{path} holds an array of Python objects; save labels and client ids as numbers "
                "or strings (numpy.array(values, dtype=str))"
            ) from None
        raise FedhetError(f"{path} is not a readable .npz file ({e}); write it with numpy.savez") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise FedhetError(f"{path} is not a readable .npz file ({e}); write it with numpy.savez") from None
    with about(path):
        return from_arrays(
            arrays["x_train"], arrays["y_train"], arrays.get("x_test"), arrays.get("y_test"),
            name=path.stem, client_ids=arrays.get("client_ids"),
            test_fraction=params.test_fraction, seed=params.split_seed,
        )


# --- .csv -------------------------------------------------------------------------------------


@dataclass
class Table:
    """A csv file's samples: feature names and values, labels and client ids as text."""

    features: list[str]
    x: np.ndarray
    labels: list[str]
    clients: list[str] | None
    lines: list[int]
    """The line number of each sample."""


def _rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the `(line number, fields)` of each non-blank line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise FedhetError(f"{path} is not UTF-8 text; save it as a UTF-8 csv file") from None
    except OSError as e:
        raise FedhetError(f"{path}: cannot read it ({e.strerror}); give a readable csv file") from None
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    rows = []
    try:
        for fields in reader:
            if not any(f.strip() for f in fields):
                continue
            if header is None:
                header = [f.strip() for f in fields]
            else:
                rows.append((reader.line_num, fields))
    except csv.Error as e:
        raise FedhetError(f"{path} line {reader.line_num}: {e}; fix the quoting of that line") from None
    if header is None:
        raise FedhetError(
            f"{path} is empty; it needs a header line of column names, then one line per sample"
        )
    return header, rows


def _column(path: Path, header: list[str], name: str, option: str, what: str) -> int:
    if name in header:
        return header.index(name)
    hint = ""
    if len(header) == 1 and (";" in header[0] or "\t" in header[0]):
        hint = " (the header holds no comma: fedhet reads comma-separated values)"
    raise FedhetError(
        f"{path} has no column {name!r} for the {what} (columns: {', '.join(header)}){hint}; "
        f"set dataset.{option}=COLUMN"
    )


def _numbers(path: Path, names: list[str], rows: list[tuple[int, list[str]]], cols: list[int]) -> np.ndarray:
    """The feature cells as float64 `(n, k)`; a cell that is not a finite number is an error
    naming its line and column."""
    cells = [[fields[j] for j in cols] for _, fields in rows]
    try:
        x = np.array(cells, dtype=np.float64).reshape(len(rows), len(cols))
    except ValueError:
        x = None
    if x is None or not np.isfinite(x).all():
        for (line, _), row in zip(rows, cells, strict=True):
            for j, cell in zip(cols, row, strict=True):
                where = f"{path} line {line}, column {names[j]!r}"
                if not cell.strip():
                    raise FedhetError(f"{where} is empty; fill the value in or drop the line")
                try:
                    value = float(cell)
                except ValueError:
                    raise FedhetError(
                        f"{where}: {cell.strip()!r} is not a number; feature columns must be numeric "
                        "(encode it as numbers, or drop the column)"
                    ) from None
                if not np.isfinite(value):
                    raise FedhetError(
                        f"{where} is {cell.strip()}, not a finite number; fill the value in or drop "
                        "the line"
                    )
    assert x is not None
    return x


def read_csv(path: Path, label: str, client: str = "", client_needed: bool = True) -> Table:
    """A csv file with a header: every column but `label` and `client` is a numeric feature.
    Without `client_needed`, a `client` column the file lacks is no error (a test file)."""
    header, rows = _rows(path)
    if not client_needed and client not in header:
        client = ""
    if len(set(header)) != len(header):
        twice = next(n for n in header if header.count(n) > 1)
        raise FedhetError(f"{path} has two columns named {twice!r}; give each column its own name")
    y_col = _column(path, header, label, "label", "labels")
    c_col = _column(path, header, client, "client", "client ids") if client else None
    if not rows:
        raise FedhetError(f"{path} has a header but no samples; add one line per sample")
    for line, fields in rows:
        if len(fields) != len(header):
            raise FedhetError(
                f"{path} line {line} has {len(fields)} fields but the header has {len(header)}; "
                f"give every line {len(header)} comma-separated values"
            )
    _refuse_row_index(path, header, rows)
    cols = [j for j in range(len(header)) if j not in (y_col, c_col)]
    if not cols:
        raise FedhetError(f"{path} has no feature columns besides {label!r}; add numeric columns")
    x = _numbers(path, header, rows, cols)
    for key, j in (("label", y_col), ("client", c_col)):
        if j is None:
            continue
        for line, fields in rows:
            if not fields[j].strip():
                raise FedhetError(
                    f"{path} line {line}, column {header[j]!r} is empty; give every sample its {key}"
                )
    labels = [fields[y_col].strip() for _, fields in rows]
    clients = None if c_col is None else [fields[c_col].strip() for _, fields in rows]
    return Table([header[j] for j in cols], x, labels, clients, [line for line, _ in rows])


def _refuse_row_index(path: Path, header: list[str], rows: list[tuple[int, list[str]]]) -> None:
    """A first column with no name (or pandas' `Unnamed: 0`) is the row index
    `DataFrame.to_csv` writes by default, whatever it holds (0, 1, 2, … or a slice's or a
    shuffle's labels), not a feature: read as one, it makes every sample unlike every other.
    **[choice]** it is refused in one line rather than dropped, so that no column of the user's
    file is left out without their word."""
    name = header[0].strip()
    if name and not name.startswith("Unnamed:"):
        return
    first = [fields[0].strip() for _, fields in rows[:3]]
    raise FedhetError(
        f"{path}: its first column {header[0]!r} has no name (values {', '.join(first)}, …): the "
        "row index pandas writes unless to_csv(..., index=False), not a feature; save the file "
        "with index=False, or give that column a name if it is a feature"
    )


def _ids(values: list[str]) -> np.ndarray:
    """Text values as integers when every one is a whole number (`3`, `3.0`; so `10` sorts after
    `9`), else as strings."""
    try:
        numbers = np.array([float(v) for v in values])
    except ValueError:
        return np.array(values, dtype=str)
    if np.isfinite(numbers).all() and (numbers == np.round(numbers)).all():
        return numbers.astype(np.int64)
    return np.array(values, dtype=str)


def _classes(path: Path, table: Table, column: str) -> np.ndarray:
    """The label column as `_ids`; numbers that are not whole (a regression target) are refused."""
    y = _ids(table.labels)
    if y.dtype.kind == "U":
        for i, v in enumerate(table.labels):
            try:
                number = float(v)
            except ValueError:
                continue
            if not (math.isfinite(number) and number == int(number)):
                raise FedhetError(
                    f"{path} line {table.lines[i]}, column {column!r}: {v} is not a class; the "
                    "label column holds integers or names (set dataset.label to the class column)"
                )
    return y


def load_csv(path: Path, params: CsvParams) -> Dataset:
    """Feature columns, the `label` column, optionally the `client` column, and optionally a
    test file (`test`) with the same feature columns."""
    train = read_csv(path, params.label, params.client)
    x_test = y_test = None
    if params.test:
        test_path = Path(params.test)
        if not test_path.is_file():
            raise FedhetError(f"dataset.test={params.test}: no such file; give the test csv file's path")
        test = read_csv(test_path, params.label, params.client, client_needed=False)
        if set(test.features) != set(train.features):
            raise FedhetError(
                f"{test_path}'s feature columns ({', '.join(test.features)}) differ from those of "
                f"{path} ({', '.join(train.features)}); give both files the same feature columns"
            )
        order = [test.features.index(n) for n in train.features]
        x_test, y_test = test.x[:, order], _classes(test_path, test, params.label)
    with about(path):
        data = from_arrays(
            train.x, _classes(path, train, params.label), x_test, y_test, name=path.stem,
            client_ids=None if train.clients is None else _ids(train.clients),
            test_fraction=params.test_fraction, seed=params.split_seed,
        )
    data.meta["features"] = train.features
    return data


# --- image folders ----------------------------------------------------------------------------


def class_folders(root: Path) -> list[tuple[str, list[Path]]]:
    """`(class name, its image files)` for each subfolder of `root`, by name; files of other
    types (a `Thumbs.db`, a README) are skipped."""
    dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not dirs:
        raise FedhetError(
            f"{root} has no subfolders; put each class's images in a subfolder named after the class"
        )
    out = []
    for d in dirs:
        files = sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise FedhetError(
                f"{d} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}); add its class's images "
                "or remove the folder"
            )
        out.append((d.name, files))
    return out


def _open(file: Path) -> Any:
    from PIL import Image  # Pillow, which Matplotlib requires; imported when images are read

    try:
        with Image.open(file) as im:
            im.load()
            return im.copy()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise FedhetError(
            f"{file}: cannot read the image ({e}); replace it with a valid image or remove it"
        ) from None


def read_images(files: list[Path], image_size: int) -> np.ndarray:
    """Images as float32 `(n, C, H, W)` in [0, 1]: one channel when all are grayscale, else
    three (RGB, alpha dropped); resized to `image_size` square when it is > 0, else all must
    have one size."""
    images = [_open(f) for f in files]
    mode = "L" if all(im.mode in GRAY_MODES for im in images) else "RGB"
    if image_size:
        images = [im.resize((image_size, image_size)) for im in images]
    else:
        first = images[0].size
        for f, im in zip(files, images, strict=True):
            if im.size != first:
                raise FedhetError(
                    f"{f} is {im.size[0]}×{im.size[1]} pixels (width×height) but {files[0]} is "
                    f"{first[0]}×{first[1]}; "
                    "set dataset.image_size=N to resize every image to N×N"
                )
    arr = np.stack([np.asarray(im.convert(mode), dtype=np.uint8) for im in images])
    arr = arr[:, None] if arr.ndim == 3 else arr.transpose(0, 3, 1, 2)
    return arr.astype(np.float32) / 255.0


def _split_layout(root: Path) -> tuple[Path, Path] | None:
    """`(root/train, root/test)` when the folder holds exactly those two, each of class folders."""
    subs = {d.name: d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")}
    if set(subs) != {"train", "test"}:
        return None
    if all(any(c.is_dir() for c in subs[s].iterdir()) for s in subs):
        return subs["train"], subs["test"]
    return None


def load_image_folder(root: Path, params: ImageFolderParams) -> Dataset:
    """One subfolder per class (`root/cat/*.png`, ...), or `root/train/<class>` and
    `root/test/<class>`, or a separate test folder (`test`)."""
    train_root, test_root = root, Path(params.test) if params.test else None
    layout = _split_layout(root)
    if layout is not None:
        if test_root is not None:
            raise FedhetError(
                f"{root} already holds train/ and test/; leave dataset.test out or point -d at "
                f"{root / 'train'}"
            )
        train_root, test_root = layout
    if test_root is not None and not test_root.is_dir():
        raise FedhetError(f"dataset.test={test_root}: no such folder; give the test image folder")
    train = class_folders(train_root)
    test = class_folders(test_root) if test_root is not None else []
    files = [f for _, fs in train + test for f in fs]
    x = read_images(files, params.image_size)
    y = np.array([name for name, fs in train + test for _ in fs], dtype=str)
    n = sum(len(fs) for _, fs in train)
    with about(root):
        return from_arrays(
            x[:n], y[:n], x[n:] if test else None, y[n:] if test else None, name=root.name,
            test_fraction=params.test_fraction, seed=params.split_seed,
        )


# --- the resolver -----------------------------------------------------------------------------


LOADERS: dict[str, tuple[type, Any, str]] = {
    ".npz": (NpzParams, load_npz, "arrays in a .npz file"),
    ".csv": (CsvParams, load_csv, "a csv file of numeric features and a label column"),
    "": (ImageFolderParams, load_image_folder, "a folder of images, one subfolder per class"),
}


@DATASETS.resolver
def resolve(name: str) -> Entry | None:
    """The entry of a dataset given by its path (`is_data_path`), or None for any other name."""
    if not is_data_path(name):
        return None
    path = Path(name).expanduser()
    if not path.exists():
        raise FedhetError(
            f"dataset file {name} not found; give the path of an existing .npz or .csv file or "
            f"image folder, or a dataset name ({', '.join(n for n in DATASETS.names() if not _pathy(n))})"
        )
    kind = "" if path.is_dir() else path.suffix.lower()
    if kind not in LOADERS:
        raise FedhetError(
            f"dataset file {name}: fedhet reads .npz and .csv files and folders of images, not "
            f"{path.suffix or 'files without a suffix'}; convert it to one of those"
        )
    params, load, doc = LOADERS[kind]

    def factory(p: Any, data_dir: Path) -> Dataset:
        return load(path, p)

    return Entry(name, factory, params, f"{doc}: {path}", traits={"default_model": "mlp"})
