"""The in-process engine: builds a run from a `RunConfig` and executes its rounds.

Per round `k`: sample clients (fraction C, fixed by `(seed, k)`), let the topology's round
runner move messages between the algorithm's server and client halves, evaluate the global
model on the test set, append a metrics row, and checkpoint. Everything random is drawn from
streams fixed by `(seed, round, client, purpose)`, so a resumed run continues exactly where an
uninterrupted one would be.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

try:  # the progress bar; a checkout run without tqdm (PYTHONPATH=src) prints plain lines
    from tqdm.auto import tqdm
except ImportError:
    tqdm = None

from fedhet.algorithms import state as states
from fedhet.algorithms.base import ALGORITHMS, BUFFERS, Algorithm, Message, RunInfo
from fedhet.data.base import Dataset
from fedhet.engine.clients import ClientWork, local_steps
from fedhet.engine.comm import CommLedger
from fedhet.engine.config import RESUMABLE, RunConfig, canonical_config
from fedhet.engine.evaluation import Evaluator
from fedhet.engine.evaluation import summary as run_summary
from fedhet.engine.failures import ClientFailure, Diverged
from fedhet.engine.faults import FaultModel
from fedhet.engine.federate import federate
from fedhet.engine.plan import Plan, Work, executor_for, plan
from fedhet.engine.rounds import ROUND_RUNNERS
from fedhet.engine.store import TIME_COLUMNS, RunStore
from fedhet.engine.workers import round_work, usable_cores
from fedhet.errors import FedhetError
from fedhet.models.registry import build_model
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, stream_seed


def sample_clients(cfg: RunConfig, num_clients: int, round: int) -> list[int]:
    m = max(1, round_half_up(cfg.sample_fraction * num_clients))
    if m >= num_clients:
        return list(range(num_clients))
    rng = stream_seed(cfg.seed, round, -2)
    return sorted(int(i) for i in rng.choice(num_clients, m, replace=False))


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


class Simulation:
    """One run: data, clients, model, algorithm, and the loop over rounds."""

    clients_here = True
    """Whether this process runs the client updates through its executor (a Flower server's
    clients run on SuperNodes: `--workers auto` is 1 there, with nothing to weigh)."""

    def __init__(
        self, cfg: RunConfig, store: RunStore | None = None,
        data: Dataset | None = None, log: Callable[[str], None] = print,
        on_round: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.log = log
        self.on_round = on_round
        """Called with each round's metrics row once it is saved (TensorBoard, live views)."""
        algo_cls = ALGORITHMS.get(cfg.algorithm).factory
        fed = federate(cfg, centralized=algo_cls.centralized, data=data)
        self.data, parts = fed.data, fed.parts
        torch.manual_seed(cfg.seed)
        module = build_model(cfg.model, self.data.input_shape, self.data.num_classes, cfg.model_params)
        steps = [local_steps(cfg, len(p), i, 0, clamp=False) for i, p in enumerate(parts)]
        per_round = min(len(parts), max(1, round_half_up(cfg.sample_fraction * len(parts))))
        dim = sum(p.numel() for p in module.parameters() if p.requires_grad)
        self.round_work = round_work(per_round, [max(1, t) for t in steps],
                                     [len(p) for p in parts], cfg.batch_size, dim)
        """A round's estimated multiply-adds (`fedhet.engine.workers.round_work`)."""
        self.plan: Plan = plan(cfg, usable_cores(), work=Work(module, self.round_work, per_round),
                               clients_here=self.clients_here)
        """Where this run's work runs, and why (`fedhet.engine.plan`): decided once, here."""
        if self.plan.workers_note is not None:  # else nothing was weighed: a GPU, batched, one core
            log(f"workers: auto → {self.plan.workers} ({self.plan.workers_note})")
        self.device = self.plan.device
        self.model = FlatModel(module.to(self.device))
        self.partition = parts
        if self.device.type != "cpu":  # the data goes to the device once (after partitioning)
            self.data = dataclasses.replace(
                self.data, x_train=self.data.x_train.to(self.device),
                y_train=self.data.y_train.to(self.device), x_test=self.data.x_test.to(self.device),
                y_test=self.data.y_test.to(self.device),
            )
        self.trainer = LocalTrainer(self.model, self.data.x_train, self.data.y_train)
        self.client_indices = [torch.from_numpy(np.asarray(p, dtype=np.int64)) for p in parts]
        self.run_info = RunInfo(
            num_clients=len(parts), rounds=cfg.rounds, lr=cfg.lr, momentum=cfg.momentum,
            weight_decay=cfg.weight_decay, seed=cfg.seed, dim=self.model.dim,
            layers=self.model.layers,
        )
        self.algorithm: Algorithm = algo_cls(cfg.algorithm_params, self.run_info)
        self.clients = ClientWork(
            cfg, self.model, self.trainer, self.client_indices, self.algorithm, log
        )
        self.evaluator = Evaluator(cfg, self.model, self.data, self.algorithm)
        self.algorithm.check_local_steps(steps)
        runner = ROUND_RUNNERS.get(algo_cls.topology)
        if runner is None:
            raise FedhetError(f"algorithm {cfg.algorithm} needs topology {algo_cls.topology!r}")
        self.runner = runner
        self.faults = FaultModel.from_config(cfg)
        self.comm = CommLedger(self.model.dim)
        self.w0 = self.model.params.clone()
        self.split = split_digest(self.client_indices)
        """The data split this run trains on, stored in every checkpoint (`check_same_split`)."""
        self.buffers = self.model.buffers.clone()
        self.executor_name = self.plan.executor
        self.workers = self.plan.workers
        """Processes a round's clients are spread over: `cfg.workers`, or what `auto` (0) chose."""
        self.executor = executor_for(self.plan, self.clients, cfg.cohort_chunk)

    # -- the round runner's protocol -----------------------------------------------------
    def configure(self, state: states.ServerState, client_id: int, round: int) -> Message:
        """The algorithm's downlink message, plus BatchNorm statistics when the model has any."""
        message = self.algorithm.configure(state, client_id, round)
        if self.buffers.numel():
            message.tensors = {**message.tensors, BUFFERS: self.buffers}
        return message

    def client_update(self, client_id: int, message: Message, round: int) -> Message:
        """One client, in place on the shared model (the sequential executor)."""
        return self.clients.update(client_id, message, round)

    @property
    def client_states(self) -> dict[int, Any]:
        """Each client's algorithm state between rounds (`ClientWork.states`)."""
        return self.clients.states

    def client_updates(
        self, round: int, requests: list[tuple[int, Message]]
    ) -> Iterator[tuple[int, Message | ClientFailure]]:
        """The run's executor over independent clients; yields `(client_id, reply)` in request
        order, or `(client_id, ClientFailure)` for a client that raised."""
        yield from self.executor.run(round, requests)

    # -- the loop -------------------------------------------------------------------------
    def run(
        self, resume: bool = False, progress: bool = False,
        accepted: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Run (or, with `resume`, continue from the newest good checkpoint) to `cfg.rounds`.

        `accepted` is called once the checkpoint (if any) has been found compatible with these
        settings and this data split, before anything is trained or written.

        A round whose model, loss or aggregate is not finite stops the run: the summary says
        `status: diverged` with the round and client, and the last good checkpoint is kept."""
        cfg = self.cfg
        state = states.initial_state(self.algorithm, self.w0)
        rows: list[dict[str, Any]] = []
        start, elapsed = 0, 0.0
        if resume and self.store is not None:
            ckpt = self.store.load_checkpoint(warn=self.log)
            if ckpt is not None:
                check_resumable(ckpt.get("config"), cfg.to_dict())
                check_same_split(ckpt.get("split"), self.split)
                start, elapsed = ckpt["round"], ckpt["elapsed"]
                state = states.restore_state(self.algorithm, ckpt["server"])
                self.clients.states = states.restore_clients(self.algorithm, ckpt["clients"])
                self.buffers = ckpt["buffers"]
                self.comm.restore(ckpt["comm"])
                rows = self.store.restore_rows(start, ckpt, self.log)
            else:  # killed before its first checkpoint: it starts again, with no stale records
                self.store.rows_until(0)
        if accepted is not None:
            accepted()
        if self.store is not None:
            self.store.write_plan(self.plan.rows())
        if not rows:
            rows.append(self._evaluate(state, 0, {}))
            self.evaluator.check_finite(state, rows[-1], -1)
            if self.store is not None:
                self.store.write_metrics(rows)
        bar = _progress(cfg.rounds, start, progress)
        t_start = time.perf_counter() - elapsed
        try:
            for k in range(start, cfg.rounds):
                t0 = time.perf_counter()
                clients = sample_clients(cfg, self.run_info.num_clients, k)
                state, diag = self.runner(self, state, k, clients)
                if diag.get("clients_failed") and not diag.get("clients_returned"):
                    raise FedhetError(
                        f"every client that ran in round {k + 1} failed (the first error is logged "
                        "above); when no client survives, it is a bug or a bad setting, not a "
                        "simulated fault"
                    )
                state = self._average_buffers(state)
                train_time = time.perf_counter() - t0
                scalars = {
                    n: float(v) for n, v in diag.items() if isinstance(v, int | float | np.floating)
                }
                structured = {n: v for n, v in diag.items() if n not in scalars}
                row = self._evaluate(state, k + 1, scalars)
                self.evaluator.check_finite(state, row, k)
                row.update(self.comm.close_round())
                row["round_time_s"] = train_time
                row["eval_time_s"] = time.perf_counter() - t0 - train_time
                row["wall_time_s"] = time.perf_counter() - t_start
                rows.append(row)
                self._save(k + 1, state, rows, {"round": k + 1, **structured} if structured else None,
                           row["wall_time_s"])
                if self.on_round is not None:
                    self.on_round(row)
                if bar is not None:
                    bar.set_postfix(acc=f"{row['test_accuracy']:.4f}", loss=f"{row['test_loss']:.4f}")
                    bar.update(1)
        except (Diverged, OverflowError, FloatingPointError) as e:
            return self._diverged(e, rows, k)
        finally:
            if bar is not None:
                bar.close()
            close = getattr(self.executor, "close", None)
            if close is not None:
                close()
        self.final_state = state
        summary = self.summary(rows, finished=True)
        if start >= cfg.rounds and self.store is not None:
            # killed after the last checkpoint but before the final summary was written
            self.store.write_summary(summary)
        return summary

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
        kept = self.clients.take_buffers()
        if buffers is not None:
            self.buffers = buffers.to(self.buffers.device, torch.float32)
        elif kept:
            stacked = torch.stack([b.to(torch.float64) for _, b in kept])
            weights = torch.tensor([w for w, _ in kept], dtype=torch.float64, device=stacked.device)
            self.buffers = ((weights / weights.sum()) @ stacked).to(torch.float32)
        return state

    def _evaluate(self, state: states.ServerState, round: int, diag: dict[str, float]) -> dict:
        """Round `round`'s metrics row (`Evaluator.row`) with the server's BatchNorm statistics."""
        return self.evaluator.row(state, round, diag, self.buffers)

    def _save(self, done: int, state, rows, record: dict[str, Any] | None, elapsed: float) -> None:
        """Append the round's metrics row and diagnostics record; checkpoint the state."""
        if self.store is None:
            return
        self.store.append_metrics(rows)
        if record is not None:
            self.store.append_diagnostics(record)
        if done % self.cfg.checkpoint_every == 0 or done == self.cfg.rounds:
            self.store.save_checkpoint({
                "round": done, "elapsed": elapsed, "server": states.state_record(state),
                "clients": states.client_records(self.clients.states),
                "buffers": self.buffers, "comm": self.comm.state(), "config": self.cfg.to_dict(),
                "split": self.split, **self.store.history_state(),
            })
        self.store.write_summary(self.summary(rows, finished=done == self.cfg.rounds))

    def summary(self, rows: list[dict[str, Any]], finished: bool) -> dict[str, Any]:
        """The run's `summary.json` from its metrics rows (`evaluation.summary`)."""
        return run_summary(self.cfg, self.run_info.num_clients, rows, finished)


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


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    if tqdm is None:
        return _PlainProgress(total, initial)
    return tqdm(total=total, initial=initial, unit="round", dynamic_ncols=True)


class _PlainProgress:
    """The part of tqdm's interface the loop uses, as one line per round on stderr (no tqdm)."""

    def __init__(self, total: int, initial: int) -> None:
        self.total, self.n, self.postfix = total, initial, ""

    def set_postfix(self, **values: str) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        print(f"round {self.n}/{self.total} {self.postfix}".rstrip(), file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


__all__ = ["Simulation", "TIME_COLUMNS", "sample_clients"]
