"""The round loop: one run's rounds over its built parts (`fedhet.engine.assembly` builds them).

Per round `k`: sample clients (fraction C, fixed by `(seed, k)`), let the topology's round
runner move messages between the algorithm's server and client halves (the client halves run
through the run's executor), evaluate the global model on the test set, append a metrics row,
checkpoint, and tell the run's callbacks (`fedhet.engine.callbacks`: a truthy `on_round` stops
the run after a saved round). Everything random is drawn from streams fixed by
`(seed, round, client, purpose)`, so a resumed run continues exactly where an uninterrupted one
would be.

The loop reads `LoopSettings` of the run's settings; the whole config (`config.json`) only goes
into checkpoints, the resume check and the summary.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.algorithms import state as states
from fedhet.algorithms.base import BUFFERS, Algorithm, Message, RunInfo
from fedhet.data.base import Dataset
from fedhet.engine.callbacks import CallbackLike, Callbacks, ProgressBar, RunView, StopRun
from fedhet.engine.client_store import CLIENT_STATES
from fedhet.engine.clients import ClientHost
from fedhet.engine.comm import CommLedger
from fedhet.engine.config import RESUMABLE, ConfigFields, canonical_config
from fedhet.engine.evaluation import Evaluator
from fedhet.engine.evaluation import summary as run_summary
from fedhet.engine.executors import Executor
from fedhet.engine.failures import (
    ClientFailure,
    Diverged,
    UserCodeFailed,
    algorithm_call,
    blame,
)
from fedhet.engine.faults import FaultModel
from fedhet.engine.plan import Plan
from fedhet.engine.rounds import RoundRunner, RunnerContext
from fedhet.errors import FedhetError, one_line
from fedhet.rundir.store import TIME_COLUMNS, RunStore, read_checkpoint
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, stream_seed


@dataclass(frozen=True)
class LoopSettings(ConfigFields):
    """The settings the round loop reads (the `RunConfig` fields of the same names)."""

    rounds: int
    seed: int
    sample_fraction: float
    checkpoint_every: int


NO_RESULT = ("final_accuracy", "final_loss", "best_accuracy", "best_round")
"""Summary keys a failed run does not have (`Simulation._failed`)."""


def sample_clients(settings: LoopSettings, num_clients: int, round: int) -> list[int]:
    """Round `round`'s clients: `max(1, ⌊C·N⌉)` of `N`, drawn from the stream `(seed, round)`."""
    m = max(1, round_half_up(settings.sample_fraction * num_clients))
    if m >= num_clients:
        return list(range(num_clients))
    rng = stream_seed(settings.seed, round, -2)
    return sorted(int(i) for i in rng.choice(num_clients, m, replace=False))


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


@dataclass
class ClientSide:
    """The clients' half of a run: what runs client updates, and nothing of the server."""

    data: Dataset
    """On the plan's device, after the validation hold-out."""
    partition: list[np.ndarray]
    client_indices: list[torch.Tensor]
    model: FlatModel
    trainer: LocalTrainer
    run_info: RunInfo
    algorithm: Algorithm
    clients: ClientHost
    plan: Plan
    executor: Executor
    round_cost: float
    """A round's estimated multiply-adds (`fedhet.engine.workers.round_cost`)."""
    steps: list[int]
    """Each client's planned `⌊E·D_i/B⌋` in round 0, unclamped (`Algorithm.check_local_steps`)."""
    held_out: list[np.ndarray] = dataclasses.field(default_factory=list)
    """Each client's held-out share for per-client evaluation (empty when it is off)."""
    own_parts: list[np.ndarray] = dataclasses.field(default_factory=list)
    """Each client's own training indices where they are not `partition` (`Federation`)."""


@dataclass
class Parts:
    """A run's built parts: the clients' half, and the server's (`fedhet.engine.assembly.assemble`
    builds them from settings and whatever was handed in)."""

    loop: LoopSettings
    config: dict[str, Any]
    """The run's `config.json` (`RunConfig.to_dict`): checkpoints, the resume check, summary."""
    side: ClientSide
    evaluator: Evaluator
    faults: FaultModel
    comm: CommLedger
    runner: RoundRunner


class Simulation:
    """One run: its built parts (`parts`) and the loop over rounds (`run`).

    It holds what the loop itself changes (the server state, the BatchNorm statistics, the
    algorithm's notes, the round's failed clients) and reads everything else from `parts`;
    round runners see a `RunnerContext` of it and callbacks a `RunView`, never the whole."""

    def __init__(
        self, parts: Parts, store: RunStore | None = None, log: Callable[[str], None] = print,
        callbacks: Sequence[CallbackLike] = (),
    ) -> None:
        self.parts = parts
        """The run's built parts (`fedhet.engine.assembly.assemble`); a test or a caller may
        hand in another fault model or executor (`parts.faults`, `side.executor`) before `run`."""
        self.store = store
        self.log = log
        self.callbacks: list[CallbackLike] = list(callbacks)
        """Told of the run's start, each saved round's metrics row and its end (`run`)."""
        self.notes: list[str] = []
        """The algorithm's remarks so far (`Algorithm.note`), each said once."""
        self.round_failures: list[ClientFailure] = []
        """The clients that failed in the round under way (`rounds._fail`), first one first."""
        side = parts.side
        self.w0 = side.model.params.clone()
        """The initial global model `w^0`."""
        self.split = split_digest(side.client_indices)
        """The data split this run trains on, stored in every checkpoint (`check_same_split`)."""
        self.buffers = side.model.buffers.clone()
        """The server's BatchNorm statistics (empty for a model without any)."""
        if store is not None:  # the clients' states wait in the run directory, not in /tmp
            side.clients.states.attach(store.out / CLIENT_STATES)
        self.start_round = 0
        """The round the current `run` call started after (0, or a checkpoint's round)."""
        self.state: states.ServerState | None = None
        """The server state after the last round run (set by `run`)."""
        self.final_state: states.ServerState | None = None
        """The server state the last `run` call ended with."""

    @property
    def side(self) -> ClientSide:
        """The clients' half of `parts`: data, partition, model, trainer, algorithm, executor."""
        return self.parts.side

    # -- the round runner's protocol -----------------------------------------------------
    def round_context(self) -> RunnerContext:
        """What the round runner sees of the run (`rounds.RunnerContext`), made for each round
        from the run's parts as they are then (a test or a caller may hand in another fault
        model or executor after assembly)."""
        return RunnerContext(
            algorithm=self.side.algorithm, comm=self.parts.comm, faults=self.parts.faults, log=self.log,
            round_failures=self.round_failures, configure=self.configure,
            client_update=self.client_update, client_updates=self.client_updates,
            executor=self.side.executor,
            client_chains=getattr(self.side.executor, "chains", None),
        )

    def configure(self, state: states.ServerState, client_id: int, round: int) -> Message:
        """The algorithm's downlink message, plus BatchNorm statistics when the model has any."""
        message = self.side.algorithm.configure(state, client_id, round)
        if self.buffers.numel():
            message.tensors = {**message.tensors, BUFFERS: self.buffers}
        return message

    def client_update(self, client_id: int, message: Message, round: int) -> Message:
        """One client whose reply the round needs now, through the run's executor (in process:
        in place on the shared model, as the sequential executor)."""
        return self.side.executor.update(client_id, message, round)

    def client_updates(
        self, round: int, requests: Sequence[tuple[int, Message]]
    ) -> Iterator[tuple[int, Message | ClientFailure]]:
        """The run's executor over independent clients; yields `(client_id, reply)` in request
        order, or `(client_id, ClientFailure)` for a client that raised."""
        yield from self.side.executor.run(round, requests)

    # -- the loop -------------------------------------------------------------------------
    def run(
        self, resume: bool = False, progress: bool = False,
        accepted: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Run (or, with `resume`, continue from the newest good checkpoint) to `loop.rounds`.

        `accepted` is called once the checkpoint (if any) has been found compatible with these
        settings and this data split, before anything is trained or written. `progress` adds a
        `ProgressBar` to the run's callbacks for this call.

        A round whose model, loss or aggregate is not finite stops the run: the summary says
        `status: diverged` with the round and client, and the last good checkpoint is kept. A
        callback that returns a truthy value from `on_round` stops it after that round: the
        summary says `status: stopped`, and a resume continues from there."""
        state = states.initial_state(self.side.algorithm, self.w0)
        rows: list[dict[str, Any]] = []
        start, elapsed = 0, 0.0
        if resume and self.store is not None:
            ckpt = self.store.load_checkpoint(warn=self.log)
            if ckpt is not None:  # read onto the CPU; its state computes where the model is
                ckpt = states.on_device(ckpt, self.side.plan.device)
                check_resumable(ckpt.get("config"), self.parts.config)
                check_same_split(ckpt.get("split"), self.split)
                start, elapsed = ckpt["round"], ckpt["elapsed"]
                state = states.restore_state(self.side.algorithm, ckpt["server"])
                self._restore_clients(ckpt, start)
                self.buffers = ckpt["buffers"]
                self.parts.comm.restore(ckpt["comm"])
                rows = self.store.restore_rows(start, ckpt, self.log)
            else:  # killed before its first checkpoint: it starts again, with no stale records
                self.store.rows_until(0)
                self.side.clients.states.reset()
        else:
            self.side.clients.states.reset()
        if accepted is not None:
            accepted()
        if self.store is not None:
            self.store.write_plan(self.side.plan.rows())
        if not rows:
            rows.append(self._evaluate(state, 0, {}))
            self.parts.evaluator.check_finite(state, rows[-1], -1)
            if self.store is not None:
                self.store.write_metrics(rows)
        self.start_round = start
        self.state = state
        callbacks = Callbacks([*self.callbacks, *([ProgressBar()] if progress else [])])
        callbacks.start(RunView(
            self.store.out if self.store is not None else None, self.parts.config, self.parts.loop.rounds,
            start, lambda: self.side.algorithm.eval_params(self._current_state()),
            self.global_state_dict,
        ))
        summary = None
        try:
            summary = self._rounds(state, rows, start, elapsed, callbacks)
        finally:
            callbacks.end(summary)
        return summary

    def _rounds(
        self, state: states.ServerState, rows: list[dict[str, Any]], start: int, elapsed: float,
        callbacks: Callbacks,
    ) -> dict[str, Any]:
        """Rounds `start + 1 … loop.rounds`; the run's summary."""
        loop = self.parts.loop
        t_start = time.perf_counter() - elapsed
        try:
            for k in range(start, loop.rounds):
                t0 = time.perf_counter()
                clients = sample_clients(loop, self.side.run_info.num_clients, k)
                self.round_failures.clear()
                state, diag = self.parts.runner(self.round_context(), state, k, clients)
                if diag.get("clients_failed") and not diag.get("clients_returned"):
                    raise self._all_failed(k)
                self._note(self.side.algorithm.note(k, diag))
                state = self._average_buffers(state)
                train_time = time.perf_counter() - t0
                scalars = {
                    n: float(v) for n, v in diag.items() if isinstance(v, int | float | np.floating)
                }
                structured = {n: v for n, v in diag.items() if n not in scalars}
                row = self._evaluate(state, k + 1, scalars)
                self.parts.evaluator.check_finite(state, row, k)
                row.update(self.parts.comm.close_round())
                row["round_time_s"] = train_time
                row["eval_time_s"] = time.perf_counter() - t0 - train_time
                row["wall_time_s"] = time.perf_counter() - t_start
                rows.append(row)
                self.state = state
                self._save(k + 1, state, rows, {"round": k + 1, **structured} if structured else None,
                           row["wall_time_s"])
                if callbacks.round(row) and k + 1 < loop.rounds:
                    return self._stopped(k + 1, state, rows)
        except (Diverged, OverflowError, FloatingPointError) as e:
            return self._diverged(e, rows, k)
        except UserCodeFailed as e:
            self._failed(e, rows)
            raise
        except (FedhetError, StopRun):
            raise
        except Exception as e:  # code the run called raised: the user's, a library's or ours
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._disk_full(e, k) from e
            where, user = blame(e)
            failed = UserCodeFailed(k, one_line(e), where, user, call=algorithm_call(e))
            self._failed(failed, rows)
            raise failed from e
        finally:
            self.side.executor.close()
        self.final_state = state
        summary = self.summary(rows, finished=True)
        if start >= loop.rounds and self.store is not None:
            # killed after the last checkpoint but before the final summary was written
            self.store.write_summary(summary)
        return summary

    def _stopped(self, done: int, state: states.ServerState, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """A callback stopped the run after round `done`: checkpoint it (when `_save` did not)
        and mark the summary `stopped`, so that a resume continues exactly there."""
        self.final_state = state
        summary = self.summary(rows, finished=False)
        summary["status"] = "stopped"
        if self.store is not None:
            if done % self.parts.loop.checkpoint_every:
                self._checkpoint(done, state, rows[-1]["wall_time_s"])
            self.store.write_summary(summary)
        return summary

    def _disk_full(self, error: OSError, round: int) -> FedhetError:
        """The disk filled while round `round` was saved: one line naming the directory; the
        files are written atomically, so every round saved before is intact and a resume
        continues from the last checkpoint once there is room."""
        where = self.store.out if self.store is not None else Path(error.filename or ".")
        return FedhetError(
            f"no room left on the disk to save round {round + 1} in {where} ({error.strerror}); "
            "every round saved before is kept: free some space, then resume the run "
            f"(`fedhet run --resume {where}`) to continue from its last checkpoint"
        )

    def _all_failed(self, round: int) -> UserCodeFailed:
        """Every client that ran in `round` failed: not a simulated fault but a bug or a bad
        setting, named by the first failure (the others were logged)."""
        first = self.round_failures[0] if self.round_failures else None
        every = f"every client that ran in round {round + 1} failed"
        if first is None:
            return UserCodeFailed(round, every, "", False)
        return UserCodeFailed(round, f"{first.error}; {every}", first.where, first.user,
                              client=first.client_id, call=first.call)

    def _failed(self, error: UserCodeFailed, rows: list[dict[str, Any]]) -> None:
        """Mark the run `failed` with the round and the error; every round already saved stays,
        so a resume after the fix continues from the last checkpoint. **[choice]** A failed run
        has no final or best accuracy (nor loss) in its summary: it produced no result, and the
        rounds it did finish stay in metrics.csv."""
        summary = {k: v for k, v in self.summary(rows, finished=False).items()
                   if k not in NO_RESULT}
        summary.update(status="failed", failed=error.record())
        if self.store is not None:
            self.store.write_summary(summary)

    def _diverged(self, error: Exception, rows: list[dict[str, Any]], round: int) -> dict[str, Any]:
        """Mark the run `diverged` (strict JSON summary) and keep the last good checkpoint."""
        if isinstance(error, Diverged):
            info = {"round": error.round + 1, "what": error.what, "client": error.client_id}
        else:  # arithmetic overflow inside a client (e.g. lr=1e300)
            info = {"round": round + 1, "what": f"overflow ({error})", "client": None}
        summary = self.summary(rows, finished=False)
        summary.update(status="diverged", diverged=info)
        if self.store is not None:
            self.store.write_summary(summary)
        return summary

    def _average_buffers(self, state: states.ServerState) -> states.ServerState:
        """The round's BatchNorm statistics, aggregated as the model is **[choice]**.

        An algorithm that aggregates them itself returns them in its state's `buffers`
        (hierarchical topologies: the edges average their devices' statistics with the model,
        the cloud the edges'); they are taken out of the state here. Otherwise (star
        topologies) the engine averages the statistics of every client update of the round with
        the run's weights (`buffer_weight`: `D_i`, or 1 with `weighting="uniform"`)."""
        state, buffers = states.take_buffers(state)
        kept = self.side.clients.take_buffers()
        if buffers is not None:
            self.buffers = buffers.to(self.buffers.device, torch.float32)
        elif kept:
            stacked = torch.stack([b.to(torch.float64) for _, b in kept])
            weights = torch.tensor([w for w, _ in kept], dtype=torch.float64, device=stacked.device)
            self.buffers = ((weights / weights.sum()) @ stacked).to(torch.float32)
        return state

    def _evaluate(self, state: states.ServerState, round: int, diag: dict[str, float]) -> dict:
        """Round `round`'s metrics row (`Evaluator.row`) with the server's BatchNorm statistics,
        and the executor's columns (a Flower server's bytes on the wire)."""
        row = self.parts.evaluator.row(state, round, diag, self.buffers)
        row.update(self.side.executor.columns())
        return row

    def _save(self, done: int, state, rows, record: dict[str, Any] | None, elapsed: float) -> None:
        """Append the round's metrics row and diagnostics record; checkpoint the state."""
        if self.store is None:
            return
        self.store.append_metrics(rows)
        if record is not None:
            self.store.append_diagnostics(record)
        if done % self.parts.loop.checkpoint_every == 0 or done == self.parts.loop.rounds:
            self._checkpoint(done, state, elapsed)
        self.store.write_summary(self.summary(rows, finished=done == self.parts.loop.rounds))

    def _checkpoint(self, done: int, state: states.ServerState, elapsed: float) -> None:
        """Save round `done`: the server's state and, for the clients, the manifest of their
        state files (`ClientStateStore.save`: only the states changed since the last checkpoint
        are written now)."""
        assert self.store is not None
        kept = self.side.clients.states
        self.store.save_checkpoint({
            "round": done, "elapsed": elapsed, "server": states.state_record(state),
            "client_store": kept.save(), "buffers": self.buffers, "comm": self.parts.comm.state(),
            "config": self.parts.config, "split": self.split, **self.store.history_state(),
        })
        kept.saved()

    def _restore_clients(self, ckpt: dict[str, Any], round: int) -> None:
        """The clients' states of checkpoint `ckpt` (of round `round`): its manifest of state
        files, or the records of a checkpoint written before the store (every client inline)."""
        assert self.store is not None
        kept = self.side.clients.states
        if "client_store" not in ckpt:
            kept.restore_records(states.restore_clients(self.side.algorithm, ckpt["clients"]), round)
            return
        others = []
        for path in (self.store.ckpt_path, self.store.prev_ckpt_path):
            try:
                other = read_checkpoint(path)
            except Exception:  # noqa: BLE001  (missing or unreadable: it names no file to keep)
                continue
            if other["round"] <= round and "client_store" in other:
                others.append(other["client_store"])
        kept.restore(ckpt["client_store"], others)

    def summary(self, rows: list[dict[str, Any]], finished: bool) -> dict[str, Any]:
        """The run's `summary.json` from its metrics rows (`evaluation.summary`), with the
        algorithm's `notes` when it made any."""
        out = run_summary(self.parts.config, self.side.run_info.num_clients, rows, finished)
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def _current_state(self) -> states.ServerState:
        """`state`, which `run` sets before any callback or view can ask for it."""
        if self.state is None:
            raise RuntimeError("the run has not started: it has no server state yet")
        return self.state

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """The global model (`algorithm.eval_params` of the current state, and the server's
        BatchNorm statistics) by parameter and buffer name, as CPU copies (`RunView`)."""
        w = self.side.algorithm.eval_params(self._current_state()).detach().to("cpu", torch.float32)
        out = {layer.name: w[layer.start : layer.stop].view(layer.shape).clone()
               for layer in self.side.model.layers}
        offset = 0
        for name, b in self.side.model.module.named_buffers():
            if b.is_floating_point():
                n = b.numel()
                out[name] = self.buffers[offset : offset + n].view_as(b).detach().cpu().clone()
                offset += n
            else:
                out[name] = b.detach().cpu().clone()
        return out

    def _note(self, note: str | None) -> None:
        """Say an algorithm's remark (`Algorithm.note`) once in the log and keep it for the
        summary."""
        if note and note not in self.notes:
            self.notes.append(note)
            self.log(f"note: {note}")


def check_resumable(saved: dict[str, Any] | None, current: dict[str, Any]) -> None:
    """Refuse to continue a checkpoint under settings other than its own, except `RESUMABLE`
    ones (and `rounds` only upwards, and not under a cosine schedule, which depends on it)."""
    if saved is None:
        return
    saved = canonical_config(saved)
    differ = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    bad = [k for k in differ if k not in RESUMABLE]
    if "rounds" in differ and (
        current["rounds"] < saved["rounds"] or current.get("lr_schedule") == "cosine"
    ):
        bad.insert(0, "rounds")
    if bad:
        raise FedhetError(
            f"the checkpoint was made with other settings ({', '.join(bad)} differ from "
            "config.json or the command line); resume with the run's own settings, or start a new "
            "run with --out (settings a resume may change: more rounds, "
            f"{', '.join(sorted(RESUMABLE - {'rounds'}))})"
        )


def split_digest(client_indices: Sequence[torch.Tensor]) -> str:
    """SHA-256 of the clients' sample indices, in client order: the data split a run trains on."""
    h = hashlib.sha256()
    for ix in client_indices:
        arr = np.ascontiguousarray(ix.cpu().numpy().astype(np.int64))
        h.update(len(arr).to_bytes(8, "little"))
        h.update(arr.tobytes())
    return h.hexdigest()


def check_same_split(saved: str | None, current: str) -> None:
    """Refuse a resume whose clients would hold other samples than the run started with (a
    partition file or a data file edited in between, with the settings unchanged)."""
    if saved is not None and saved != current:
        raise FedhetError(
            "the clients' data split differs from the one this run started with (the partition "
            "file or the dataset files changed); restore them, or start a new run with --out"
        )


__all__ = ["ClientSide", "LoopSettings", "Parts", "Simulation", "TIME_COLUMNS", "sample_clients"]
