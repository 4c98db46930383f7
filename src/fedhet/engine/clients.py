"""The clients' side of the engine in one process: `ClientHost`.

It holds what a client half needs and nothing of the server: the training tensors (a client
is an index array into them, docs/design.md), the shared model and its `LocalTrainer`, the
algorithm's client half, each client's own state between rounds (SCAFFOLD's `c_i`, …: a
`ClientStateStore`, which creates it when the client is first sampled and keeps at most a memory
budget of them resident), and the BatchNorm running statistics its replies carry. The executors
(`engine/executors.py`, `engine/workers.py`) run client updates through it; so does a Flower SuperNode
(`fedhet.deploy.client_app`), which holds one client and no server.

Per client update (`update`): the client's random streams are fixed by
`(seed, round, client, purpose)` (torch's default generator is reseeded from purpose 5), its
step count is `τ_(k,i)` (`local_steps`), its learning rate the round's `η_k`
(`learning_rate`), and an overflow inside the local steps is reported as `Diverged`. What it
reads of the run's settings is `LocalWork`, nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedhet.algorithms.base import BUFFERS, Algorithm, ClientContext, Message
from fedhet.engine.client_store import ClientStateStore, holding
from fedhet.engine.config import ConfigFields
from fedhet.engine.failures import Diverged
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig, stream_seed
from fedhet.training.steps import ClientOptimizer

_UNSET = object()


@dataclass(frozen=True)
class LocalWork(ConfigFields):
    """A client's local work: what one client update does between receiving the model and
    replying, as the `RunConfig` fields of the same names set it: the learning-rate schedule
    `η_k` over `rounds`, the step count `τ_(k,i)` (steps, or epochs of batches of `B`), the local
    step (SGD or Adam) and the seed of the client's random streams."""

    lr: float
    lr_schedule: str
    lr_min: float
    rounds: int
    batch_size: int
    local_epochs: float
    local_steps: int
    client_steps: tuple[int, ...]
    epochs_min: int
    epochs_max: int
    momentum: float
    weight_decay: float
    client_optimizer: ClientOptimizer
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    seed: int
    batch_order: str


def learning_rate(work: LocalWork, round: int) -> float:
    """Constant `η`, or cosine decay (FedSR §IV) over rounds `k = 0 … K−1`:
    `η_k = η_min + (η − η_min)(1 + cos(π k / (K − 1))) / 2`, so the first round trains with `η`
    and the last with `η_min` (a one-round run uses `η`)."""
    if work.lr_schedule == "constant" or work.rounds == 1:
        return work.lr
    return work.lr_min + (work.lr - work.lr_min) * 0.5 * (
        1 + math.cos(math.pi * round / (work.rounds - 1)))


def local_steps(
    work: LocalWork, num_samples: int, client_id: int, round: int, clamp: bool = True
) -> int:
    """`τ_(k,i)`: explicit steps (per client or for all), or `⌊E·D_i/B⌋` (at least 1 unless
    `clamp=False`) with `E` fixed or drawn per round."""
    if work.client_steps and client_id < len(work.client_steps):
        return work.client_steps[client_id]
    if work.local_steps:
        return work.local_steps
    epochs: float = work.local_epochs
    if work.epochs_max:
        rng = stream_seed(work.seed, round, client_id, 3)
        epochs = int(rng.integers(work.epochs_min, work.epochs_max + 1))
    steps = math.floor(epochs * num_samples / min(work.batch_size, num_samples))
    return max(1, steps) if clamp else steps


class ClientHost:
    """Hosts the clients in this process: their data indices, the algorithm's client half,
    their states between rounds and the round's BatchNorm statistics; runs a client's
    `LocalWork` on request (`update`). One per process that runs client updates (the simulator,
    a worker process, a Flower SuperNode); the executors run clients through it."""

    def __init__(
        self, local: LocalWork, model: FlatModel, trainer: LocalTrainer,
        client_indices: list[torch.Tensor], algorithm: Algorithm,
        log: Callable[[str], None] = print, states: ClientStateStore | None = None,
    ) -> None:
        self.local = local
        self.model = model
        self.trainer = trainer
        self.client_indices = client_indices
        self.algorithm = algorithm
        self.log = log
        self.states = states if states is not None else ClientStateStore(algorithm)
        """Each client's algorithm state between rounds (absent until its first update), kept
        within a memory budget (`fedhet.engine.client_store`)."""
        self.round_buffers: list[tuple[float, torch.Tensor]] = []
        """`(weight, statistics)` of the BatchNorm statistics replied so far this round."""

    # -- client state ---------------------------------------------------------------------
    def state_of(self, client_id: int) -> Any:
        """The client's state, `client_init` when it has none yet."""
        return self.states[client_id] if client_id in self.states else \
            self.algorithm.client_init(client_id)

    def hold_only(self, client_id: int, state: Any = _UNSET) -> None:
        """Forget every client's state but `client_id`'s, which becomes `state` (none when not
        given): a process that runs one client for another (a worker, a SuperNode)."""
        self.states = holding(self.algorithm, client_id, state, has=state is not _UNSET)
        self.round_buffers = []

    # -- one client -----------------------------------------------------------------------
    def update(self, client_id: int, message: Message, round: int) -> Message:
        """One client, in place on the shared model (the sequential executor, ring hops)."""
        if BUFFERS in message.tensors:
            self.model.buffers.copy_(message.tensors[BUFFERS])
        reply = self.run_client(client_id, message, round, self.trainer)
        return self.finish(client_id, reply, self.model.buffers)

    def run_client(self, client_id: int, message: Message, round: int, trainer: Any) -> Message:
        """The algorithm's client half with `trainer` as `ctx.trainer`; keeps the client's state."""
        work = self.local
        indices = self.client_indices[client_id]
        torch.default_generator.manual_seed(int(stream_seed(work.seed, round, client_id, 5).integers(2**62)))
        ctx = ClientContext(
            client_id=client_id, round=round, indices=indices, trainer=trainer,
            tau=local_steps(work, len(indices), client_id, round), batch_size=work.batch_size,
            sgd=SGDConfig(learning_rate(work, round), work.momentum, work.weight_decay,
                          work.client_optimizer, (work.adam_beta1, work.adam_beta2), work.adam_eps),
            seed=work.seed, batch_order=work.batch_order,
        )
        state = self.states.checkout(client_id)
        try:
            reply, state = self._client_update(message, ctx, state)
        except BaseException:
            self.states.release(client_id, round + 1)  # keeps what it was handed, as changed
            raise
        self.states.put(client_id, state, round + 1)
        return reply

    def _client_update(self, message: Message, ctx: ClientContext, state: Any) -> tuple[Message, Any]:
        """`algorithm.client_update`, an overflow inside the local steps raised as `Diverged`."""
        try:
            return self.algorithm.client_update(message, ctx, state)
        except (OverflowError, FloatingPointError) as e:
            raise Diverged(ctx.round, f"local step ({e})", ctx.client_id) from e
        except RuntimeError as e:  # torch: "value cannot be converted to type float without overflow"
            if "overflow" not in str(e):
                raise
            raise Diverged(ctx.round, "local step (overflow)", ctx.client_id) from e

    # -- BatchNorm statistics ---------------------------------------------------------------
    def initial_buffers(self, message: Message) -> torch.Tensor | None:
        """A client's BatchNorm statistics before its local work (None without BatchNorm)."""
        if not self.model.buffers.numel():
            return None
        return message.tensors.get(BUFFERS, self.model.buffers).clone()

    def finish(self, client_id: int, reply: Message, buffers: torch.Tensor | None) -> Message:
        """Attach the client's final BatchNorm statistics to its reply and keep them for the
        round's average."""
        if buffers is not None and buffers.numel():
            reply.tensors[BUFFERS] = buffers.clone()
            self.keep_buffers(client_id, reply)
        return reply

    def keep_buffers(self, client_id: int, reply: Message) -> None:
        """Keep a reply's BatchNorm statistics, if it carries any, for the round's average,
        with the client's `buffer_weight`."""
        if BUFFERS in reply.tensors:
            self.round_buffers.append((self.buffer_weight(client_id), reply.tensors[BUFFERS]))

    def buffer_weight(self, client_id: int) -> float:
        """A client's weight in the BatchNorm average: `1` when the algorithm weights clients
        uniformly (`weighting="uniform"`, FedNNNN's unbalanced setting), else `D_i` — the
        weights of the model average."""
        if getattr(self.algorithm.params, "weighting", "samples") == "uniform":
            return 1.0
        return float(len(self.client_indices[client_id]))

    def take_buffers(self) -> list[tuple[float, torch.Tensor]]:
        """The round's kept `(weight, statistics)`, emptied for the next round."""
        kept, self.round_buffers = self.round_buffers, []
        return kept


__all__ = ["ClientHost", "LocalWork", "learning_rate", "local_steps"]
