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
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from fedhet.algorithms import state as states
from fedhet.algorithms.base import ALGORITHMS, BUFFERS, Algorithm, ClientContext, Message, RunInfo
from fedhet.data.base import Dataset
from fedhet.engine.comm import CommLedger
from fedhet.engine.config import RESUMABLE, RunConfig, canonical_config
from fedhet.engine.executors import choose_executor, make_executor, resolve_device
from fedhet.engine.failures import ClientFailure, Diverged
from fedhet.engine.faults import FaultModel
from fedhet.engine.federate import federate
from fedhet.engine.rounds import ROUND_RUNNERS
from fedhet.engine.store import TIME_COLUMNS, RunStore
from fedhet.engine.workers import ProcessExecutor
from fedhet.errors import FedhetError
from fedhet.models.registry import build_model
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig, evaluate, stream_seed

_UNSET = object()


def learning_rate(cfg: RunConfig, round: int) -> float:
    """Constant `η`, or cosine decay (FedSR §IV) over rounds `k = 0 … K−1`:
    `η_k = η_min + (η − η_min)(1 + cos(π k / (K − 1))) / 2`, so the first round trains with `η`
    and the last with `η_min` (a one-round run uses `η`)."""
    if cfg.lr_schedule == "constant" or cfg.rounds == 1:
        return cfg.lr
    return cfg.lr_min + (cfg.lr - cfg.lr_min) * 0.5 * (1 + math.cos(math.pi * round / (cfg.rounds - 1)))


def local_steps(
    cfg: RunConfig, num_samples: int, client_id: int, round: int, clamp: bool = True
) -> int:
    """`τ_(k,i)`: explicit steps (per client or for all), or `⌊E·D_i/B⌋` (at least 1 unless
    `clamp=False`) with `E` fixed or drawn per round."""
    if cfg.client_steps and client_id < len(cfg.client_steps):
        return cfg.client_steps[client_id]
    if cfg.local_steps:
        return cfg.local_steps
    epochs: float = cfg.local_epochs
    if cfg.epochs_max:
        rng = stream_seed(cfg.seed, round, client_id, 3)
        epochs = int(rng.integers(cfg.epochs_min, cfg.epochs_max + 1))
    steps = math.floor(epochs * num_samples / min(cfg.batch_size, num_samples))
    return max(1, steps) if clamp else steps


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
        self.device = resolve_device(cfg.device)
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
        self.algorithm.check_local_steps(
            [local_steps(cfg, len(ix), i, 0, clamp=False) for i, ix in enumerate(self.client_indices)]
        )
        runner = ROUND_RUNNERS.get(algo_cls.topology)
        if runner is None:
            raise FedhetError(f"algorithm {cfg.algorithm} needs topology {algo_cls.topology!r}")
        self.runner = runner
        self.faults = FaultModel.from_config(cfg)
        self.comm = CommLedger(self.model.dim)
        self.client_states: dict[int, Any] = {}
        self.w0 = self.model.params.clone()
        self.split = split_digest(self.client_indices)
        """The data split this run trains on, stored in every checkpoint (`check_same_split`)."""
        self.buffers = self.model.buffers.clone()
        self._round_buffers: list[tuple[float, torch.Tensor]] = []
        self.executor_name = choose_executor(
            cfg.executor, self.device, cfg.model_name, module, cfg.workers
        )
        if cfg.workers > 1 and self.executor_name == "sequential":
            self.executor = ProcessExecutor(self, cfg.workers)
        else:
            self.executor = make_executor(self, self.executor_name, cfg.cohort_chunk)

    # -- the round runner's protocol -----------------------------------------------------
    def configure(self, state: states.ServerState, client_id: int, round: int) -> Message:
        """The algorithm's downlink message, plus BatchNorm statistics when the model has any."""
        message = self.algorithm.configure(state, client_id, round)
        if self.buffers.numel():
            message.tensors = {**message.tensors, BUFFERS: self.buffers}
        return message

    def client_update(self, client_id: int, message: Message, round: int) -> Message:
        """One client, in place on the shared model (the sequential executor, ring hops)."""
        if BUFFERS in message.tensors:
            self.model.buffers.copy_(message.tensors[BUFFERS])
        reply = self.run_client(client_id, message, round, self.trainer)
        return self.finish_client(client_id, reply, self.model.buffers)

    def run_client(self, client_id: int, message: Message, round: int, trainer: Any) -> Message:
        """The algorithm's client half with `trainer` as `ctx.trainer`; keeps the client's state."""
        cfg = self.cfg
        indices = self.client_indices[client_id]
        torch.default_generator.manual_seed(int(stream_seed(cfg.seed, round, client_id, 5).integers(2**62)))
        ctx = ClientContext(
            client_id=client_id, round=round, indices=indices, trainer=trainer,
            tau=local_steps(cfg, len(indices), client_id, round), batch_size=cfg.batch_size,
            sgd=SGDConfig(learning_rate(cfg, round), cfg.momentum, cfg.weight_decay),
            seed=cfg.seed, batch_order=cfg.batch_order,
        )
        state = self.client_states.get(client_id, _UNSET)
        if state is _UNSET:
            state = self.algorithm.client_init(client_id)
        try:
            reply, state = self.algorithm.client_update(message, ctx, state)
        except (OverflowError, FloatingPointError) as e:
            raise Diverged(round, f"local step ({e})", client_id) from e
        except RuntimeError as e:  # torch: "value cannot be converted to type float without overflow"
            if "overflow" not in str(e):
                raise
            raise Diverged(round, "local step (overflow)", client_id) from e
        self.client_states[client_id] = state
        return reply

    def initial_buffers(self, message: Message) -> torch.Tensor | None:
        """A client's BatchNorm statistics before its local work (None without BatchNorm)."""
        if not self.model.buffers.numel():
            return None
        return message.tensors.get(BUFFERS, self.model.buffers).clone()

    def finish_client(self, client_id: int, reply: Message, buffers: torch.Tensor | None) -> Message:
        """Attach the client's final BatchNorm statistics to its reply and keep them for the
        round's average."""
        if buffers is not None and buffers.numel():
            reply.tensors[BUFFERS] = buffers.clone()
            self.keep_buffers(client_id, reply)
        return reply

    def keep_buffers(self, client_id: int, reply: Message) -> None:
        """Keep a reply's BatchNorm statistics, if it carries any, for the round's average
        (`_average_buffers`), with the client's `buffer_weight`."""
        if BUFFERS in reply.tensors:
            self._round_buffers.append((self.buffer_weight(client_id), reply.tensors[BUFFERS]))

    def buffer_weight(self, client_id: int) -> float:
        """A client's weight in the BatchNorm average: `1` when the algorithm weights clients
        uniformly (`weighting="uniform"`, FedNNNN's unbalanced setting), else `D_i` — the
        weights of the model average."""
        if getattr(self.algorithm.params, "weighting", "samples") == "uniform":
            return 1.0
        return float(len(self.client_indices[client_id]))

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
                self.client_states = states.restore_clients(self.algorithm, ckpt["clients"])
                self.buffers = ckpt["buffers"]
                self.comm.restore(ckpt["comm"])
                rows = self.store.rows_until(start)
        if accepted is not None:
            accepted()
        if not rows:
            rows.append(self._evaluate(state, 0, {}))
            self._check_finite(state, rows[-1], -1)
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
                self._check_finite(state, row, k)
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

    def _check_finite(self, state: states.ServerState, row: dict[str, Any], round: int) -> None:
        """Raise `Diverged` when the global model or its evaluated loss is not finite."""
        if not bool(torch.isfinite(self.algorithm.eval_params(state)).all()):
            raise Diverged(round, "global model parameters")
        if self._evaluated(row["round"]) and not math.isfinite(row["test_loss"]):
            raise Diverged(round, "test loss")

    def _evaluated(self, round: int) -> bool:
        return round % self.cfg.eval_every == 0 or round == self.cfg.rounds

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
        if buffers is not None:
            self.buffers = buffers.to(self.buffers.device, torch.float32)
        elif self._round_buffers:
            stacked = torch.stack([b.to(torch.float64) for _, b in self._round_buffers])
            weights = torch.tensor(
                [w for w, _ in self._round_buffers], dtype=torch.float64, device=stacked.device
            )
            self.buffers = ((weights / weights.sum()) @ stacked).to(torch.float32)
        self._round_buffers = []
        return state

    def _evaluate(self, state: states.ServerState, round: int, diag: dict[str, float]) -> dict:
        cfg = self.cfg
        row: dict[str, Any] = {"round": round}
        if self._evaluated(round):
            models = {"": self.algorithm.eval_params(state)}
            models.update({f"_{s}": w for s, w in self.algorithm.extra_eval_params(state).items()})
            for suffix, w in models.items():
                loss, acc = evaluate(self.model, w, self.buffers, self.data.x_test, self.data.y_test)
                row[f"test_loss{suffix}"], row[f"test_accuracy{suffix}"] = loss, acc
            if cfg.train_loss:
                row["train_loss"], row["train_accuracy"] = evaluate(
                    self.model, models[""], self.buffers, self.data.x_train, self.data.y_train
                )
        else:
            row["test_loss"], row["test_accuracy"] = float("nan"), float("nan")
        row["lr"] = learning_rate(cfg, max(round - 1, 0))
        row.update(diag)
        return row

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
                "clients": states.client_records(self.client_states),
                "buffers": self.buffers, "comm": self.comm.state(), "config": self.cfg.to_dict(),
                "split": self.split,
            })
        self.store.write_summary(self.summary(rows, finished=done == self.cfg.rounds))

    def summary(self, rows: list[dict[str, Any]], finished: bool) -> dict[str, Any]:
        """Final and best accuracy, time and traffic; rows may hold numbers or saved text cells."""
        rows = [{k: _number(v) for k, v in r.items()} for r in rows]
        evaluated = [r for r in rows if not math.isnan(r.get("test_accuracy", float("nan")))]
        best = max(evaluated, key=lambda r: r["test_accuracy"]) if evaluated else {}
        last = evaluated[-1] if evaluated else {}
        nan = float("nan")
        return {
            "algorithm": self.cfg.algorithm, "dataset": self.cfg.dataset,
            "partition": self.cfg.partition, "model": self.cfg.model, "seed": self.cfg.seed,
            "clients": self.run_info.num_clients, "rounds": self.cfg.rounds,
            "rounds_done": int(rows[-1]["round"]), "finished": finished,
            "status": "finished" if finished else "running",
            "final_accuracy": last.get("test_accuracy", nan), "final_loss": last.get("test_loss", nan),
            "best_accuracy": best.get("test_accuracy", nan), "best_round": int(best.get("round", 0)),
            "total_time_s": rows[-1].get("wall_time_s", 0.0),
            "cum_bytes": int(rows[-1].get("cum_bytes", 0)),
            "cum_model_transfers": int(rows[-1].get("cum_model_transfers", 0)),
        }


def _number(value: Any) -> Any:
    """A saved metrics cell (text) as a number; numbers pass through."""
    if not isinstance(value, str):
        return value
    try:
        return float(value) if value else float("nan")
    except ValueError:
        return value


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

    return tqdm(total=total, initial=initial, unit="round", dynamic_ncols=True)


__all__ = ["Simulation", "TIME_COLUMNS", "learning_rate", "local_steps", "sample_clients"]
