"""A split as a file: the client → sample-indices map in JSON that the `file` partitioner reads
(`read_index_map`, every problem one line) and `fedhet partition --save-indices` writes
(`write_index_map`); NIID-Bench's and FedLab's `net_dataidx_map` dumped as JSON read the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.errors import FedhetError


class _Pairs(list):
    """A JSON object as its (key, value) pairs in file order, so a repeated key stays visible."""


def _json_kind(value: Any) -> str:
    if isinstance(value, _Pairs):
        return "an object"
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _read_json(path: str) -> Any:
    where = f"partition.path={path}"
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a BOM (Windows tools) is fine
    except FileNotFoundError:
        raise FedhetError(f"{where}: no such file; give the JSON file of client → sample indices") from None
    except OSError as e:
        raise FedhetError(f"{where}: cannot read it ({e.strerror}); give a readable JSON file") from None
    except UnicodeDecodeError:
        raise FedhetError(f"{where} is not UTF-8 text; give a JSON file of client → sample indices") from None
    try:
        return json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise FedhetError(
            f"{where} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); write "
            '{"0": [indices], "1": [...], ...} or [[indices], [...], ...]'
        ) from None


def _client_lists(raw: Any, where: str) -> list[Any]:
    """The file's per-client entries in client order, from `{"0": [...], ...}` or `[[...], ...]`."""
    if isinstance(raw, _Pairs):
        by_id: dict[int, Any] = {}
        for key, value in raw:
            if not (key.isdecimal() and str(int(key)) == key):
                raise FedhetError(
                    f"{where}: key {key!r} is not a client number; number the clients 0, 1, 2, ... "
                    "(no signs, spaces or leading zeros)"
                )
            if int(key) in by_id:
                raise FedhetError(f"{where}: client {key} appears twice; give each client one entry")
            by_id[int(key)] = value
        missing = sorted(set(range(len(by_id))) - set(by_id))
        if missing:
            raise FedhetError(
                f"{where}: the keys of its {len(by_id)} clients must be exactly 0..{len(by_id) - 1} "
                f"but {missing[0]} is missing; number the clients from 0 without gaps"
            )
        return [by_id[i] for i in range(len(by_id))]
    if isinstance(raw, list):
        return raw
    raise FedhetError(
        f"{where} holds {_json_kind(raw)}; it must be an object "
        '{"0": [indices], ...} or a list of lists [[indices], ...]'
    )


def _client_indices(value: Any, i: int, n_samples: int | None, where: str) -> np.ndarray:
    """Client i's entry as sorted int64 indices, refusing what is not a set of sample indices."""
    if not isinstance(value, list) or isinstance(value, _Pairs):
        raise FedhetError(f"{where}: client {i} maps to {_json_kind(value)}, not a list of sample indices")
    if not value:
        raise FedhetError(
            f"{where}: client {i} has no samples; give every client at least one, or drop it and "
            "renumber the rest"
        )
    bad = [v for v in value if type(v) is not int]
    if bad:
        raise FedhetError(
            f"{where}: client {i} lists {json.dumps(bad[0])}, not a sample index; indices are "
            "integers (0-based positions in the training set)"
        )
    top = n_samples if n_samples is not None else 2**63
    out = [v for v in value if not 0 <= v < top]
    if out:
        span = "[0, N)" if n_samples is None else f"[0, {n_samples}), the {n_samples} training samples"
        raise FedhetError(f"{where}: client {i} lists sample {out[0]}, outside {span}; indices count from 0")
    idx = np.sort(np.array(value, dtype=np.int64))
    repeated = idx[1:][np.diff(idx) == 0]
    if len(repeated):
        raise FedhetError(f"{where}: client {i} lists sample {repeated[0]} twice; list each sample once")
    return idx


def read_index_map(path: str, allow_overlap: bool = False, n_samples: int | None = None) -> list[np.ndarray]:
    """The client → sample-indices mapping in the JSON file `path`, one sorted array per client.

    Accepts `{"0": [i, ...], "1": [...], ...}` (keys exactly 0..n-1; NIID-Bench's and FedLab's
    `net_dataidx_map` dumped as JSON) or `[[i, ...], [...], ...]`. Each client needs ≥ 1 sample,
    listed once; a sample held by two clients is refused unless `allow_overlap`; with
    `n_samples`, indices must lie in `[0, n_samples)`. Every problem is a one-line `FedhetError`.
    """
    where = f"partition.path={path}"
    clients = _client_lists(_read_json(path), where)
    if not clients:
        raise FedhetError(f"{where} holds no clients; give at least one client's sample indices")
    parts = [_client_indices(v, i, n_samples, where) for i, v in enumerate(clients)]
    if not allow_overlap:
        everything = np.sort(np.concatenate(parts))
        shared = everything[1:][np.diff(everything) == 0]
        if len(shared):
            s = int(shared[0])
            a, b = [i for i, p in enumerate(parts) if (p == s).any()][:2]
            raise FedhetError(
                f"{where}: sample {s} is given to clients {a} and {b}; give each sample to one client "
                "or set partition.allow_overlap=true"
            )
    return parts


def write_index_map(parts: list[np.ndarray], path: str | Path) -> None:
    """Write `parts` as `{"0": [i, ...], ...}`, one client a line: what `read_index_map` reads."""
    lines = ",\n".join(f'"{i}": {json.dumps(np.asarray(p).tolist())}' for i, p in enumerate(parts))
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("{\n" + lines + "\n}\n", encoding="utf-8")
    except OSError as e:
        raise FedhetError(f"cannot write the indices to {path}: {e.strerror}") from None

