"""Reading the files fedhet wrote (run, grid and result files), damage and all.

Each reader returns the file's content or raises one `FedhetError` that names the file, says
what is wrong with it (missing, empty, not text, not JSON, a JSON value of the wrong kind, a
torn last line, a row of the wrong width) and how to fix it (`fix`, the caller's words, e.g.
"restore it, or run it again with --force"). No reader writes anything, so a damaged file is
reported and left as it was.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError

KINDS: dict[type, str] = {dict: "a JSON object ({...})", list: "a JSON list ([...])"}


class DamagedFileError(FedhetError):
    """A file fedhet reads is missing or damaged (what a reader raises); `problem` says how."""

    def __init__(self, message: str, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem


def damaged(path: Path, problem: str, fix: str) -> DamagedFileError:
    """The one error line of a damaged file: `PATH problem; fix`."""
    return DamagedFileError(f"{path} {problem}; {fix}", problem)


def read_text(path: Path, fix: str) -> str:
    """`path` as UTF-8 text: missing, a directory, unreadable, empty, or holding bytes that are
    not text (NUL, invalid UTF-8) is one `FedhetError`."""
    path = Path(path)
    if path.exists() and not path.is_dir() and not path.is_file():
        raise damaged(path, "is not a regular file (a pipe or a device: reading it could wait "
                      "forever)", fix)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise damaged(path, "is missing", fix) from None
    except IsADirectoryError:
        raise damaged(path, "is a directory, not a file", fix) from None
    except OSError as e:
        raise damaged(path, f"cannot be read ({e.strerror or e})", fix) from None
    if not data.strip():
        raise damaged(path, "is empty", fix)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise damaged(path, f"is not text (byte {e.start} is not UTF-8: binary or damaged)",
                      fix) from None
    if "\x00" in text:
        raise damaged(path, f"is not text (a NUL byte at offset {text.index(chr(0))}: binary or "
                      "damaged)", fix)
    return text


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return KINDS.get(type(value), type(value).__name__)


def read_json(path: Path, fix: str, kind: type = dict) -> Any:
    """A JSON file whose top level is a `kind` (a dict: `{...}`); anything else is one
    `FedhetError` (`read_text`'s, not JSON, torn, or another kind of value)."""
    text = read_text(path, fix)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        where = "it ends early: torn" if e.pos >= len(text.rstrip()) else f"line {e.lineno}"
        raise damaged(path, f"is not valid JSON ({e.msg}, {where})", fix) from None
    if not isinstance(value, kind):
        raise damaged(path, f"holds {_kind(value)} where fedhet writes {KINDS.get(kind, kind.__name__)}",
                      fix)
    return value


def read_json_lines(path: Path, fix: str) -> list[dict[str, Any]]:
    """A JSON-lines file (one object a line, each line ended by a newline)."""
    text = read_text(path, fix)
    lines = text.split("\n")
    if lines[-1].strip():
        raise damaged(path, f"ends in a torn line (line {len(lines)} has no end)", fix)
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise damaged(path, f"line {n} is not valid JSON ({e.msg})", fix) from None
        if not isinstance(record, dict):
            raise damaged(path, f"line {n} holds {_kind(record)} where fedhet writes a JSON object",
                          fix)
        records.append(record)
    return records


def read_csv(path: Path, fix: str, required: Sequence[str] = ()) -> tuple[list[str], list[dict[str, str]]]:
    """A CSV file with a header line as `(columns, rows of text cells)`: it must be text, end
    with a newline (else its last line is torn), hold whole quoted fields, give every row as
    many cells as the header, and have the `required` columns."""
    text = read_text(path, fix)
    if not text.endswith(("\n", "\r")):
        raise damaged(path, f"ends in a torn line (line {text.count(chr(10)) + 1} has no end)", fix)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    numbered: list[tuple[int, list[str]]] = []
    try:
        for cells in reader:
            numbered.append((reader.line_num, cells))
    except csv.Error as e:
        raise damaged(path, f"is not valid CSV at line {reader.line_num} ({e}: a torn or damaged "
                      "field)", fix) from None
    columns = numbered[0][1]
    if len(set(columns)) != len(columns) or any(not c.strip() for c in columns):
        raise damaged(path, f"has a damaged header line ({','.join(columns)[:80]!r})", fix)
    missing = [c for c in required if c not in columns]
    if missing:
        raise damaged(path, f"lacks the column(s) {', '.join(missing)} (its header is "
                      f"{','.join(columns)[:80]!r})", fix)
    rows = []
    for line, cells in numbered[1:]:
        if not cells:
            continue
        if len(cells) != len(columns):
            raise damaged(path, f"line {line} has {len(cells)} cells where the header has "
                          f"{len(columns)} (a torn or damaged row)", fix)
        rows.append(dict(zip(columns, cells, strict=True)))
    return columns, rows
