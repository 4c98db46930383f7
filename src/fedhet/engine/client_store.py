"""Where the clients' own states live between rounds: `ClientStateStore` (docs/scale.md).

A client's state (SCAFFOLD's `c_i`, MOON's previous model, GraB's orders, …) exists from the
round the client is first sampled: `ClientHost` asks the algorithm's `client_init` for it then,
never before, so a client that is never sampled costs nothing. The store keeps at most a memory
budget of states resident (`client_state_memory_mb`), the least recently used first out; a
state pushed out goes to a file of its own, `<directory>/<client>-<version>.pt` (`torch.save`
of its plain record, written to a temporary name and renamed into place), and comes back from
there the next time its client is sampled. Its *version* is the round count after the round
that made it (`round + 1`), so a file, once a checkpoint names it, is never written again: a
later round makes a later version.

A checkpoint holds no client state, only a manifest: which version of which client is current
at that round (`save`). Before the manifest is written the store writes the states that changed
since the last checkpoint and are still only in memory, and flushes the files written since then
to disk; the other clients' files are already there, so a checkpoint writes what changed and
nothing else. After it, files that neither the new nor the previous checkpoint names are deleted
(`saved`), the previous one being the fallback `checkpoint.prev.pt`. A resume (`restore`) reads
the manifest and deletes every file no checkpoint names: states spilled after the checkpoint
(a run killed between a spill and the next checkpoint) are never seen. Checkpoints written
before the store (every client's record inline) come back through `restore_records`.

A run without a run directory spills to a private temporary directory, removed when the store is
garbage collected or the process exits. States of algorithms whose clients keep nothing (None)
are remembered as such and never written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.algorithms import state as states
from fedhet.errors import FedhetError
from fedhet.rundir.ownership import fsync_dir
from fedhet.rundir.store import SAFE_GLOBALS

CLIENT_STATES = "client_states"
"""The run directory's subdirectory of client state files."""

NONE = -1
"""A manifest's version for a client whose state is None (no file)."""

ENTRY_BYTES = 256
"""**[choice]** What an entry counts against the budget besides its arrays (Python objects)."""

TRIM_BYTES = 64 << 20
"""Bytes of states let go between two `malloc_trim` calls. **[measured]** glibc keeps the memory
of freed model-sized tensors for reuse rather than giving it back, so a store that turns over
100 SCAFFOLD states (0.8 MB each) a round held 2.7 GB of RSS for its 1 GB of resident states
after 60 rounds; trimming after every 64 MB let go kept it at 1.3 GB (benchmarks/RESULTS.md)."""

_SUFFIX = ".pt"


def state_nbytes(value: Any) -> int:
    """The memory a state holds: its tensors' storages (each once) and arrays, plus a small
    overhead per entry (`ENTRY_BYTES`). A tensor that views a larger storage counts it whole."""
    seen: set[tuple[str, int]] = set()

    def walk(v: Any) -> int:
        if isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            key = (str(v.device), storage.data_ptr())
            if key in seen:
                return 0
            seen.add(key)
            return storage.nbytes()
        if isinstance(v, np.ndarray):
            return v.nbytes
        if isinstance(v, states.Record):
            return sum(walk(x) for x in vars(v).values())
        if isinstance(v, list | tuple):
            return 8 * len(v) + sum(walk(x) for x in v)
        if isinstance(v, dict):
            return 16 * len(v) + sum(walk(x) for x in v.values())
        return 0

    return ENTRY_BYTES + walk(value)


def _compact(value: Any) -> Any:
    """`value` with every tensor that views a larger storage copied out, so that a file holds
    the state and not the stack it was cut from (`torch.save` writes whole storages)."""
    if isinstance(value, torch.Tensor):
        whole = value.untyped_storage().nbytes()
        return value.clone() if whole > value.numel() * value.element_size() else value
    if isinstance(value, list):
        return [_compact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_compact(v) for v in value)
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    return value


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _remove_tree(path: str, pid: int) -> None:
    """Remove a private spill directory, only in the process that made it (a forked worker
    that drops its copy of the store must not remove its parent's files)."""
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


def _parse(name: str) -> tuple[int, int] | None:
    """`(client, version)` of a state file's name, None for any other name."""
    if not name.endswith(_SUFFIX):
        return None
    client, dash, version = name[: -len(_SUFFIX)].partition("-")
    if not dash or not client.isdigit() or not version.isdigit():
        return None
    return int(client), int(version)


class ClientStateStore(Mapping[int, Any]):
    """The clients' states between rounds (module docstring): a mapping from client id to its
    typed state, for the clients that have one. Reading a spilled state loads it back.

    `budget`: bytes of states kept resident (None: no limit). `directory`: where states are
    spilled (None: a private temporary directory, made on the first spill). `device`: where a
    state read back from a file is put (None: where it was saved), so that a run resumed on
    another device than the one that wrote its states finds them beside its model."""

    def __init__(self, algorithm: states.HasStates, budget: int | None = None,
                 directory: Path | None = None, device: torch.device | str | None = None) -> None:
        self.algorithm = algorithm
        self.device = device
        self.budget = budget
        self.directory = Path(directory) if directory is not None else None
        self._private: str | None = None
        self._resident: OrderedDict[int, Any] = OrderedDict()
        """States in memory, least recently used first."""
        self._sizes: dict[int, int] = {}
        self.resident_bytes = 0
        self._version: dict[int, int] = {}
        """Every client with a state: the version of its current state (`NONE` for None)."""
        self._dirty: set[int] = set()
        """Resident clients whose current version has no file yet."""
        self._pinned: set[int] = set()
        """Clients whose state is out for an update (`checkout`): never evicted meanwhile."""
        self._files: dict[int, set[int]] = {}
        """The versions on disk, by client."""
        self._unsynced: set[tuple[int, int]] = set()
        """Files written since the last checkpoint and not yet flushed to disk."""
        self._changed: set[int] = set()
        """Clients whose version changed since the last checkpoint."""
        self._saved: dict[int, int] = {}
        """The manifest of the last checkpoint (written or resumed from)."""
        self._prune_next: set[int] = set()
        """Clients whose files the next checkpoint's pruning must look at besides `_changed`:
        those changed at the last one (the checkpoint before it, now dropped, named another
        version of them)."""
        self._let_go = 0
        """Bytes of states dropped from memory since the last `malloc_trim`."""
        self.spills = 0
        """States written to files because the budget was full (not at checkpoints)."""
        self.loads = 0
        """States read back from files."""

    # -- where the files go -----------------------------------------------------------------
    def attach(self, directory: Path) -> None:
        """Spill into `directory` (a run directory's `CLIENT_STATES`) from now on."""
        self.directory = Path(directory)

    def _dir(self) -> Path:
        if self.directory is None:
            self._private = tempfile.mkdtemp(prefix="fedhet-client-states-")
            weakref.finalize(self, _remove_tree, self._private, os.getpid())
            self.directory = Path(self._private)
        self.directory.mkdir(parents=True, exist_ok=True)
        return self.directory

    def path(self, client_id: int, version: int) -> Path:
        """The file of version `version` of the client's state."""
        assert self.directory is not None
        return self.directory / f"{client_id}-{version}{_SUFFIX}"

    # -- the mapping --------------------------------------------------------------------------
    def __contains__(self, client_id: object) -> bool:
        return client_id in self._version

    def __iter__(self) -> Iterator[int]:
        return iter(self._version)

    def __len__(self) -> int:
        return len(self._version)

    def __getitem__(self, client_id: int) -> Any:
        version = self._version[client_id]
        if version == NONE:
            return None
        if client_id in self._resident:
            self._resident.move_to_end(client_id)
            return self._resident[client_id]
        state = self._load(client_id, version)
        self._keep(client_id, state)
        self._evict()
        return state

    def versions(self) -> dict[int, int]:
        """Each client's current version (`NONE`: its state is None)."""
        return dict(self._version)

    def resident(self) -> list[int]:
        """The clients whose state is in memory, least recently used first."""
        return list(self._resident)

    # -- an update --------------------------------------------------------------------------
    def checkout(self, client_id: int) -> Any:
        """The client's state for an update (`client_init` when it has none yet), held in
        memory until `put` or `release`."""
        if client_id not in self._version:
            return self.algorithm.client_init(client_id)
        self._pinned.add(client_id)  # before it is read back: not evicted at once
        return self[client_id]

    def put(self, client_id: int, state: Any, version: int) -> None:
        """The client's new state, made in the round whose count after it is `version`."""
        self._pinned.discard(client_id)
        self._drop(client_id)
        self._version[client_id] = NONE if state is None else version
        self._changed.add(client_id)
        if state is not None:
            self._keep(client_id, state)
            self._dirty.add(client_id)
        self._evict()

    def release(self, client_id: int, version: int) -> None:
        """An update that raised: the client keeps the state it was handed, as changed in
        place so far (what a dict of states would hold)."""
        if client_id not in self._pinned:
            return
        self._pinned.discard(client_id)
        if client_id in self._resident:  # else None: nothing to change in place
            self.put(client_id, self._resident[client_id], version)

    # -- memory -------------------------------------------------------------------------------
    def _keep(self, client_id: int, state: Any) -> None:
        self._resident[client_id] = state
        self._resident.move_to_end(client_id)
        size = state_nbytes(state)
        self._sizes[client_id] = size
        self.resident_bytes += size

    def _drop(self, client_id: int) -> None:
        if client_id in self._resident:
            del self._resident[client_id]
            self.resident_bytes -= self._sizes.pop(client_id)
        self._dirty.discard(client_id)

    def _evict(self) -> None:
        """Spill the least recently used states until the resident ones fit the budget."""
        if self.budget is None or self.resident_bytes <= self.budget:
            return
        for client_id in list(self._resident):
            if self.resident_bytes <= self.budget:
                break
            if client_id in self._pinned:
                continue
            if client_id in self._dirty:
                self._write(client_id)
                self.spills += 1
            self._let_go += self._sizes.get(client_id, 0)
            self._drop(client_id)
        if self._let_go >= TRIM_BYTES:
            self._let_go = 0
            trim = _malloc_trim()
            if trim is not None:
                trim(0)

    # -- files --------------------------------------------------------------------------------
    def _write(self, client_id: int) -> None:
        """Write the resident current version of the client's state to its file."""
        version = self._version[client_id]
        path = self._dir() / f"{client_id}-{version}{_SUFFIX}"
        record = _compact(states.client_record(self._resident[client_id]))
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(record, tmp)
        os.replace(tmp, path)
        self._files.setdefault(client_id, set()).add(version)
        self._unsynced.add((client_id, version))
        self._dirty.discard(client_id)

    def _load(self, client_id: int, version: int) -> Any:
        path = self.path(client_id, version)
        try:
            with torch.serialization.safe_globals(SAFE_GLOBALS):
                record = torch.load(path, map_location=self.device, weights_only=True)
        except Exception as e:  # noqa: BLE001  (a missing, cut or foreign file reads the same)
            raise FedhetError(
                f"client {client_id}'s saved state {path} is unreadable ({type(e).__name__}); "
                "start the run again with --force"
            ) from None
        self.loads += 1
        return states.restore_client(self.algorithm, record, client_id)

    def _delete(self, client_id: int, version: int) -> None:
        self.path(client_id, version).unlink(missing_ok=True)
        self._unsynced.discard((client_id, version))
        versions = self._files.get(client_id)
        if versions is not None:
            versions.discard(version)
            if not versions:
                del self._files[client_id]

    # -- checkpoints --------------------------------------------------------------------------
    def save(self) -> dict[str, Any]:
        """Before a checkpoint: write the changed states still only in memory, flush every
        file written since the last checkpoint, and return the manifest the checkpoint holds
        (`ids`, `versions`: every client with a state; `changed`: those that changed since the
        last checkpoint, whose files are the only ones written for this one)."""
        for client_id in sorted(self._dirty):
            self._write(client_id)
        if self._unsynced:
            for client_id, version in sorted(self._unsynced):
                fd = os.open(self.path(client_id, version), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(self._dir())
            self._unsynced.clear()
        ids = list(self._version)
        return {
            "ids": torch.tensor(ids, dtype=torch.int64),
            "versions": torch.tensor([self._version[i] for i in ids], dtype=torch.int64),
            "changed": torch.tensor(sorted(self._changed), dtype=torch.int64),
        }

    def saved(self) -> None:
        """After the checkpoint of the last `save` is written: delete the files that neither it
        nor the checkpoint before it names."""
        for client_id in self._changed | self._prune_next:
            keep = {self._version.get(client_id), self._saved.get(client_id)}
            for version in list(self._files.get(client_id, ())):
                if version not in keep:
                    self._delete(client_id, version)
        for client_id in self._changed:
            self._saved[client_id] = self._version[client_id]
        self._prune_next, self._changed = self._changed, set()

    def reset(self) -> None:
        """A run that starts from round 0: forget every state and remove the state files an
        earlier run left in the directory."""
        self._forget()
        if self.directory is not None and self.directory.is_dir():
            for entry in self.directory.iterdir():
                if _parse(entry.name) is not None or entry.name.endswith(".tmp"):
                    entry.unlink(missing_ok=True)

    def _forget(self) -> None:
        for name in ("_resident", "_sizes", "_version", "_files", "_saved"):
            getattr(self, name).clear()
        for name in ("_dirty", "_pinned", "_unsynced", "_changed", "_prune_next"):
            getattr(self, name).clear()
        self.resident_bytes = 0

    def restore(self, manifest: Mapping[str, Any], others: Iterable[Mapping[str, Any]] = ()) -> None:
        """Resume from a checkpoint's manifest (`save`): its versions become current, nothing
        resident; files that neither it nor the `others` (the other checkpoint kept) name are
        deleted, so no state newer than the checkpoint is ever read."""
        self._forget()
        current = _versions(manifest)
        self._version.update(current)
        self._saved.update(current)
        keep = {(c, v) for c, v in current.items() if v != NONE}
        for other in others:
            versions = _versions(other)
            keep |= {(c, v) for c, v in versions.items() if v != NONE}
            self._prune_next |= {c for c, v in versions.items() if current.get(c) != v}
        if self.directory is not None and self.directory.is_dir():
            for entry in self.directory.iterdir():
                parsed = _parse(entry.name)
                if parsed in keep:
                    self._files.setdefault(parsed[0], set()).add(parsed[1])
                elif parsed is not None or entry.name.endswith(".tmp"):
                    entry.unlink(missing_ok=True)
        missing = [(c, v) for c, v in current.items() if v != NONE and v not in self._files.get(c, ())]
        if missing:
            raise FedhetError(
                f"the checkpoint names {len(missing)} client state files that are missing from "
                f"{self.directory} (the first: {missing[0][0]}-{missing[0][1]}{_SUFFIX}); restore "
                "them, or start the run again with --force"
            )

    def restore_records(self, records: Mapping[int, Any], version: int) -> None:
        """Resume from a checkpoint written before the store (every client's state inline): the
        states become current at `version` (the checkpoint's round) and the next checkpoint
        writes them all."""
        self.reset()
        for client_id, state in records.items():
            self.put(int(client_id), state, version)


def _versions(manifest: Mapping[str, Any]) -> dict[int, int]:
    ids, versions = manifest["ids"], manifest["versions"]
    return dict(zip((int(i) for i in ids), (int(v) for v in versions), strict=True))


def read_records(directory: Path, manifest: Mapping[str, Any]) -> dict[int, Any]:
    """Every client's state record that a checkpoint's manifest names (None for a None state),
    read from the run's `directory` of state files: what the checkpoint holds, as records."""
    out: dict[int, Any] = {}
    for client_id, version in _versions(manifest).items():
        if version == NONE:
            out[client_id] = None
            continue
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            out[client_id] = torch.load(Path(directory) / f"{client_id}-{version}{_SUFFIX}",
                                        weights_only=True)
    return out


def holding(
    algorithm: states.HasStates, client_id: int, state: Any = None, has: bool = False
) -> ClientStateStore:
    """A store of one client's state, in memory only: a process that runs one client for
    another (a worker, a Flower SuperNode). `has`: the client has a state (`state`)."""
    store = ClientStateStore(algorithm)
    if has:
        store.put(client_id, state, 0)
    return store


__all__ = ["CLIENT_STATES", "ClientStateStore", "holding", "read_records", "state_nbytes"]
