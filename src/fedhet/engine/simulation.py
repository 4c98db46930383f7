"""The in-process engine: builds a run from a `RunConfig` and executes its rounds.

Per round `k`: sample clients (fraction C, fixed by `(seed, k)`), let the topology's round
runner move messages between the algorithm's server and client halves, evaluate the global
model on the test set, append a metrics row, and checkpoint. Everything random is drawn from
streams fixed by `(seed, round, client, purpose)`, so a resumed run continues exactly where an
uninterrupted one would be.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.algorithms.base import ALGORITHMS, Algorithm, ClientContext, Message, RunInfo
from fedhet.data.base import Dataset
from fedhet.data.partition import partition_dataset
from fedhet.data.registry import DATASETS
from fedhet.data.split import hold_out_validation
from fedhet.engine.comm import CommLedger
from fedhet.engine.config import RunConfig
from fedhet.engine.executors import choose_executor, make_executor, resolve_device
from fedhet.engine.failures import ClientFailure
from fedhet.engine.rounds import ROUND_RUNNERS
from fedhet.engine.store import TIME_COLUMNS, RunStore
from fedhet.errors import FedhetError
from fedhet.models.registry import build_model
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig, evaluate, stream_seed

BUFFERS = "_buffers"
_UNSET = object()


def learning_rate(cfg: RunConfig, round: int) -> float:
    """Constant `η`, or cosine decay from `η` to `lr_min` over the run (FedSR §IV)."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return cfg.lr_min + (cfg.lr - cfg.lr_min) * 0.5 * (1 + math.cos(math.pi * round / cfg.rounds))


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
        self, cfg: RunConfig, params: dict[str, Any], store: RunStore | None = None,
        data: Dataset | None = None, log: Callable[[str], None] = print,
        on_round: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.log = log
        self.on_round = on_round
        """Called with each round's metrics row once it is saved (TensorBoard, live views)."""
        self.data = data or DATASETS.get(cfg.dataset).factory(params["dataset"], Path(cfg.data_dir))
        if cfg.validation_fraction:
            self.data = hold_out_validation(self.data, cfg.validation_fraction)
        torch.manual_seed(cfg.seed)
        module = build_model(cfg.model, self.data.input_shape, self.data.num_classes, params["model"])
        self.device = resolve_device(getattr(cfg, "device", "auto"))
        self.model = FlatModel(module.to(self.device))
        algo_cls = ALGORITHMS.get(cfg.algorithm).factory
        if algo_cls.centralized:
            parts = [np.arange(len(self.data.y_train))]
        else:
            parts = partition_dataset(
                self.data, cfg.partition, cfg.clients, params["partition"], cfg.seed
            )
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
        self.algorithm: Algorithm = algo_cls(params["algorithm"], self.run_info)
        self.algorithm.check_local_steps(
            [local_steps(cfg, len(ix), i, 0, clamp=False) for i, ix in enumerate(self.client_indices)]
        )
        runner = ROUND_RUNNERS.get(algo_cls.topology)
        if runner is None:
            raise FedhetError(f"algorithm {cfg.algorithm} needs topology {algo_cls.topology!r}")
        self.runner = runner
        self.comm = CommLedger(self.model.dim)
        self.client_states: dict[int, Any] = {}
        self.w0 = self.model.params.clone()
        self.buffers = self.model.buffers.clone()
        self._round_buffers: list[tuple[int, torch.Tensor]] = []
        self.executor_name = choose_executor(
            getattr(cfg, "executor", "auto"), self.device, cfg.model_name, module
        )
        self.executor = make_executor(self, self.executor_name, getattr(cfg, "cohort_chunk", 0))

    # -- the round runner's protocol -----------------------------------------------------
    def configure(self, state: dict[str, Any], client_id: int, round: int) -> Message:
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
        reply, state = self.algorithm.client_update(message, ctx, state)
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
            self._round_buffers.append((len(self.client_indices[client_id]), reply.tensors[BUFFERS]))
        return reply

    def client_updates(
        self, round: int, requests: list[tuple[int, Message]]
    ) -> Iterator[tuple[int, Message | ClientFailure]]:
        """The run's executor over independent clients; yields `(client_id, reply)` in request
        order, or `(client_id, ClientFailure)` for a client that raised."""
        yield from self.executor.run(round, requests)

    # -- the loop -------------------------------------------------------------------------
    def run(self, resume: bool = False, progress: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        state = self.algorithm.init(self.w0)
        rows: list[dict[str, Any]] = []
        records: list[dict[str, Any]] = []
        start, elapsed = 0, 0.0
        if resume and self.store is not None:
            ckpt = self.store.load_checkpoint(warn=self.log)
            if ckpt is not None:
                start, elapsed = ckpt["round"], ckpt["elapsed"]
                state, self.client_states = ckpt["server"], ckpt["clients"]
                self.buffers = ckpt["buffers"]
                rows, records = ckpt["rows"], ckpt["records"]
                self.comm.restore(ckpt["comm"])
        if not rows:
            rows.append(self._evaluate(state, 0, {}))
        bar = _progress(cfg.rounds, start, progress)
        t_start = time.perf_counter() - elapsed
        for k in range(start, cfg.rounds):
            t0 = time.perf_counter()
            clients = sample_clients(cfg, self.run_info.num_clients, k)
            state, diag = self.runner(self, state, k, clients)
            self._average_buffers()
            train_time = time.perf_counter() - t0
            scalars = {
                n: float(v) for n, v in diag.items() if isinstance(v, int | float | np.floating)
            }
            structured = {n: v for n, v in diag.items() if n not in scalars}
            row = self._evaluate(state, k + 1, scalars)
            row.update(self.comm.close_round())
            row["round_time_s"] = train_time
            row["eval_time_s"] = time.perf_counter() - t0 - train_time
            row["wall_time_s"] = time.perf_counter() - t_start
            rows.append(row)
            if structured:
                records.append({"round": k + 1, **structured})
            self._save(k + 1, state, rows, records, row["wall_time_s"])
            if self.on_round is not None:
                self.on_round(row)
            if bar is not None:
                bar.set_postfix(acc=f"{row['test_accuracy']:.4f}", loss=f"{row['test_loss']:.4f}")
                bar.update(1)
        if bar is not None:
            bar.close()
        self.final_state = state
        if start >= cfg.rounds and self.store is not None:
            # killed after the last checkpoint but before the final summary was written
            self.store.write_metrics(rows)
            self.store.write_summary(self.summary(rows, finished=True))
        return self.summary(rows, finished=True)

    def _average_buffers(self) -> None:
        """BatchNorm statistics **[choice]**: the sample-weighted mean over every client update
        of the round, whatever the topology."""
        if self._round_buffers:
            stacked = torch.stack([b.to(torch.float64) for _, b in self._round_buffers])
            sizes = torch.tensor(
                [n for n, _ in self._round_buffers], dtype=torch.float64, device=stacked.device
            )
            self.buffers = ((sizes / sizes.sum()) @ stacked).to(torch.float32)
            self._round_buffers = []

    def _evaluate(self, state: dict[str, Any], round: int, diag: dict[str, float]) -> dict:
        cfg = self.cfg
        row: dict[str, Any] = {"round": round}
        if round % cfg.eval_every == 0 or round == cfg.rounds:
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

    def _save(self, done: int, state, rows, records, elapsed: float) -> None:
        if self.store is None:
            return
        self.store.write_metrics(rows)
        if records:
            self.store.write_diagnostics(records)
        if done % self.cfg.checkpoint_every == 0 or done == self.cfg.rounds:
            self.store.save_checkpoint({
                "round": done, "elapsed": elapsed, "server": state, "clients": self.client_states,
                "buffers": self.buffers, "rows": rows, "records": records,
                "comm": self.comm.state(),
            })
        self.store.write_summary(self.summary(rows, finished=done == self.cfg.rounds))

    def summary(self, rows: list[dict[str, Any]], finished: bool) -> dict[str, Any]:
        evaluated = [r for r in rows if not math.isnan(r.get("test_accuracy", float("nan")))]
        best = max(evaluated, key=lambda r: r["test_accuracy"])
        last = evaluated[-1]
        return {
            "algorithm": self.cfg.algorithm, "dataset": self.cfg.dataset,
            "partition": self.cfg.partition, "model": self.cfg.model, "seed": self.cfg.seed,
            "clients": self.run_info.num_clients, "rounds": self.cfg.rounds,
            "rounds_done": rows[-1]["round"], "finished": finished,
            "final_accuracy": last["test_accuracy"], "final_loss": last["test_loss"],
            "best_accuracy": best["test_accuracy"], "best_round": best["round"],
            "total_time_s": rows[-1].get("wall_time_s", 0.0),
            "cum_bytes": rows[-1].get("cum_bytes", 0),
            "cum_model_transfers": rows[-1].get("cum_model_transfers", 0),
        }


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="round", dynamic_ncols=True)


__all__ = ["Simulation", "TIME_COLUMNS", "learning_rate", "local_steps", "sample_clients"]
