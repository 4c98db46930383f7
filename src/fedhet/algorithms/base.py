"""The algorithm contract (docs/design.md): client and server halves talk only through `Message`s.

An algorithm is a subclass of `Algorithm` registered in `ALGORITHMS`. Its server half is
`init`, `configure` (the downlink message for one client), `aggregate` (replies → new state and
diagnostics) and `eval_params`; its client half is `client_init` and `client_update`, which sees
only the message it was sent, its own `ClientContext` (its data, the shared trainer, its step
count) and its own state. Nothing crosses except messages, so the same code runs in-process
and over a network, and `Message.nbytes` is an honest communication count.

States are typed (`fedhet.algorithms.state`): the server's is a frozen `ServerState` dataclass
(`state_class`), a client's a `ClientState` dataclass (`client_state_class`) or None.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast

import numpy as np
import torch

from fedhet.algorithms.state import BUFFERS, ClientState, ServerState
from fedhet.errors import FedhetError
from fedhet.registry import NoParams, Registry
from fedhet.training.flat import Layer
from fedhet.training.local import LocalTrainer, SGDConfig, stream_seed

SCALAR_BYTES = 8


@dataclass
class Message:
    """Named tensors plus scalars: all that travels between a client and the server."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)

    def nbytes(self) -> int:
        tensor_bytes = sum(t.numel() * t.element_size() for t in self.tensors.values())
        return tensor_bytes + SCALAR_BYTES * len(self.scalars)


@dataclass
class Reply:
    client_id: int
    message: Message


@dataclass(frozen=True)
class RunInfo:
    """What the server half knows about the run when it is built (no client data)."""

    num_clients: int
    rounds: int
    lr: float
    momentum: float
    weight_decay: float
    seed: int
    dim: int
    layers: tuple[Layer, ...]
    client_optimizer: str = "sgd"
    """The clients' local optimizer (`sgd`, `adam`, `adamw`; `RunConfig.client_optimizer`)."""


@dataclass
class ClientContext:
    """What one client has locally in one round."""

    client_id: int
    round: int
    """The round's index from 0, as `configure` and `aggregate` get it: round k of the run (its
    error lines, progress lines and metrics.csv row k) has index k − 1 (docs/library.md)."""
    indices: torch.Tensor
    trainer: LocalTrainer
    tau: int
    """Engine-assigned local step count for this round (`⌊E·D_i/B⌋` or as configured)."""
    batch_size: int
    sgd: SGDConfig
    seed: int
    batch_order: str = "reshuffle"

    @property
    def num_samples(self) -> int:
        return len(self.indices)

    def objective_gradient(
        self, w: torch.Tensor, indices: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`∇F_i(w)` of the objective the local steps descend: the exact mean gradient over
        `indices` (default: all the client's samples) plus the weight decay `λ w` that every
        local step adds (SCAFFOLD option I, FedVeca's `∇F_i(w_k)`)."""
        g = self.trainer.full_gradient(w, self.indices if indices is None else indices)
        if self.sgd.weight_decay:
            g.add_(w, alpha=self.sgd.weight_decay)
        return g

    def rng(self, purpose: int = 0) -> np.random.Generator:
        """The client's random stream for this round, fixed by (seed, round, client, purpose)."""
        return stream_seed(self.seed, self.round, self.client_id, purpose)

    def batches(
        self, steps: int, order: str | None = None, purpose: int = 0
    ) -> Iterator[torch.Tensor]:
        """`steps` mini-batches of this client's data. `order="fixed"` repeats one permutation,
        drawn once per client for the whole run, in every epoch and round (non-RR).
        `purpose` picks another reshuffling stream for a second visit in the same round
        (a later ring pass or edge iteration)."""
        order = order or self.batch_order
        rng = stream_seed(self.seed, -1, self.client_id, 7) if order == "fixed" else self.rng(purpose)
        return self.trainer.batches(self.indices, self.batch_size, steps, rng, order)


S = TypeVar("S", bound=ServerState)
"""The server state an algorithm keeps (its `state_class`)."""
C = TypeVar("C", bound=ClientState | None)
"""A client's state (its `client_state_class`); None where clients keep nothing."""


class Algorithm(Generic[S, C]):
    """Base class: FedAvg's messages and defaults; subclasses override what differs.

    Generic in the server state `S` and the client state `C` it keeps, so a subclass's halves
    are typed with its own states: `class Scaffold(Algorithm[ScaffoldState,
    ScaffoldClientState])`; a family that others extend stays generic (`FedAvg[S, C]`)."""

    name: ClassVar[str] = ""
    topology: ClassVar[str] = "star"
    centralized: ClassVar[bool] = False
    state_class: ClassVar[type[ServerState]] = ServerState
    """The type of the server state `init` returns and `aggregate` keeps."""
    client_state_class: ClassVar[type[ClientState] | None] = None
    """The type of a client's state, None for an algorithm whose clients keep nothing."""
    plain_sgd: ClassVar[str] = ""
    """Why the algorithm's update rule assumes plain local SGD steps `w ← w − η g` (the reason
    given when `client_optimizer` is adam or adamw, which it refuses); empty: any local
    optimizer."""

    def __init__(self, params: Any, run: RunInfo) -> None:
        self.params = params
        self.run = run
        if self.plain_sgd and run.client_optimizer != "sgd":
            raise FedhetError(
                f"{self.name or type(self).__name__} needs client_optimizer=sgd, got "
                f"{run.client_optimizer}: {self.plain_sgd}"
            )

    # -- server half ----------------------------------------------------------------------
    def init(self, w0: torch.Tensor) -> S:
        # `state_class` is S's class: a class variable cannot name the type variable
        return cast(S, self.state_class(w=w0.clone()))

    def configure(self, state: S, client_id: int, round: int) -> Message:
        return Message({"w": state.w})

    def aggregate(
        self, state: S, round: int, replies: Iterable[Reply]
    ) -> tuple[S, dict[str, Any]]:
        """The new server state and the round's diagnostics from the replies that came back.
        `round` is the round's index from 0 (`ClientContext.round`): the state returned by
        `aggregate(state, k - 1, ...)` is what metrics.csv reports as round k.

        The new state is a new object of the same class (`dataclasses.replace(state, w=…)`);
        `state` itself is left as it was.

        `replies` is a one-pass iterable: the round runners hand over a generator that runs
        the clients as it is read, so an aggregate reads it once and keeps running sums
        (`WeightedMean`), never every reply. A rule that truly needs all replies at once calls
        `list(replies)` and says why. It is never empty (the runner keeps the state when no
        client returned); its clients are the ones that returned (partial participation)."""
        raise NotImplementedError

    def eval_params(self, state: S) -> torch.Tensor:
        return state.w

    def check_local_steps(self, steps: Sequence[int]) -> None:
        """Reject the run before training when the planned `⌊E·D_i/B⌋` (unclamped, one per
        client) does not suit the algorithm (BHerd needs ≥ 1 gradient). Default: accept."""

    def note(self, round: int, diagnostics: Mapping[str, Any]) -> str | None:
        """A remark on how the run is going, from round `round`'s diagnostics (an adaptive
        quantity stuck at the edge of its range): the engine says each one once, in the log and
        in the summary's `notes`. Default: none."""
        return None

    def extra_eval_params(self, state: S) -> dict[str, torch.Tensor]:
        """Further models to evaluate each round, by metric suffix (FedNNNN's plain average)."""
        return {}

    # -- client half ----------------------------------------------------------------------
    def client_init(self, client_id: int) -> C:
        """A client's state before its first round (None: it keeps none, or builds it then)."""
        return cast(C, None)  # an algorithm whose clients keep a state overrides this

    def client_update(
        self, message: Message, ctx: ClientContext, state: C
    ) -> tuple[Message, C]:
        raise NotImplementedError


ALGORITHMS: Registry[type[Algorithm[Any, Any]]] = Registry("algorithm")
"""Every algorithm module registers its classes here; importing `fedhet.algorithms` (which any
import of this module does first) imports them all.

Traits an algorithm may declare when it registers (`Entry.trait`):
- `example`: the settings (`--set` paths: `{"model": "moon-mlp"}`, `{"algorithm.clusters": 2}`)
  that a small run of it needs beyond the engine's defaults, for a handful of clients of
  `digits`: a model it requires, parameters that must fit few clients. The tests that cover
  every registered algorithm (tests/registered.py) run it with them; CONTRIBUTING.md says more.
"""


def sample_weights(replies: Sequence[Reply], weighting: str = "samples") -> torch.Tensor:
    """`p_i` over the replying clients: `D_i / Σ D_j` (`samples`) or `1/m` (`uniform`)."""
    if weighting == "uniform":
        return torch.full((len(replies),), 1.0 / len(replies), dtype=torch.float64)
    sizes = torch.tensor([r.message.scalars["num_samples"] for r in replies], dtype=torch.float64)
    return sizes / sizes.sum()


def weighted_sum(weights: torch.Tensor, vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """`Σ_i p_i v_i` accumulated in float64, returned as float32."""
    acc = torch.zeros(vectors[0].shape, dtype=torch.float64, device=vectors[0].device)
    for p, v in zip(weights.tolist(), vectors, strict=True):
        acc.add_(v.to(torch.float64), alpha=p)
    return acc.to(torch.float32)


class WeightedMean:
    """`Σ_i p_i v_i` with `p_i = w_i / Σ_j w_j` over the replies added so far, as one stacked
    operation per block of replies.

    Replies arrive one at a time (`add`). Each named vector waits in a block until the block
    holds `block_bytes` of vectors (or `block_rows` replies, or the mean is asked for); the
    block is then stacked, `V` of shape `(n, d)`, and added to the running float64 sum as one
    matrix–vector product, `S ← S + cᵀ V` with `c_i = w_i · scale_i` (float64). So a round of
    `m` replies costs `⌈m·d·4 / block_bytes⌉` stacked products instead of `m` separate
    accumulations (each a kernel launch or two on a GPU), and the memory it holds is bounded by
    `block_bytes` per name whatever the number of clients. Vectors on a CPU are summed as they
    come (`blocks_on_cpu`). The weight `w_i` is `D_i` (`weighting="samples"`) or 1
    (`"uniform"`); `scale` multiplies a vector's weight on top (BHerd's `η_i τ_i`). Equal to
    `weighted_sum(sample_weights(...))` up to float64 rounding (the terms are summed in another
    order); the same replies in the same order always give the same bits, whichever executor
    produced them.
    """

    block_bytes: ClassVar[int] = 64 * 2**20
    """**[choice]** Bytes of float32 vectors a block holds per name before it is summed (64 MiB:
    ≈ 39 FedNNNN-CNN updates, so 100 replies are 3 products; the stacked float64 copy is twice
    that, on the device); 0 sums every reply alone."""
    block_rows: ClassVar[int] = 1024
    """At most this many replies a block."""
    blocks_on_cpu: ClassVar[bool] = False
    """**[choice]** Off: a vector on a CPU is added to the sum as it comes, `S ← S + c_i v_i`.
    A CPU kernel costs no launch, and stacking is two more passes over memory: on one core the
    blocks took 1.2–5.3× the reply-by-reply time at the FedNNNN CNN's size, for 2.6–6.6× fewer
    operations (`benchmarks/bench_server.py`, benchmarks/RESULTS.md). The tests and the
    benchmark turn it on to check and measure the blocks on a CPU."""

    def __init__(self, weighting: str = "samples") -> None:
        self.weighting = weighting
        self.total = 0.0
        """`Σ_i w_i` over the added replies."""
        self.count = 0
        self._sums: dict[str, torch.Tensor] = {}
        self._blocks: dict[str, tuple[list[torch.Tensor], list[float]]] = {}
        self.scalar_sums: dict[str, float] = {}

    def weight(self, reply: Reply) -> float:
        """The unnormalised weight `w_i` of one reply."""
        return 1.0 if self.weighting == "uniform" else float(reply.message.scalars["num_samples"])

    def add(
        self, reply: Reply, tensors: Iterable[str] = (), scalars: Iterable[str] = (),
        scale: dict[str, float] | None = None,
    ) -> float:
        """Add the reply's named tensors and scalars; returns its weight `w_i`."""
        w = self.weight(reply)
        self.total += w
        self.count += 1
        for name in tensors:
            v = reply.message.tensors[name]
            vectors, coefficients = self._blocks.setdefault(name, ([], []))
            vectors.append(v)
            coefficients.append(w * (scale or {}).get(name, 1.0))
            if self.block_full(len(vectors), v):
                self._flush(name)
        for name in scalars:
            value = reply.message.scalars.get(name, float("nan"))
            self.scalar_sums[name] = self.scalar_sums.get(name, 0.0) + w * value
        return w

    @classmethod
    def block_full(cls, count: int, vector: torch.Tensor) -> bool:
        """Whether a block of `count` vectors like `vector` is to be summed now: it holds
        `block_rows` of them or `block_bytes` of float32, or they are on a CPU and
        `blocks_on_cpu` is off (then every vector is summed as it comes)."""
        return count >= cls.block_rows or count * vector.numel() * 4 >= cls.block_bytes \
            or (vector.device.type == "cpu" and not cls.blocks_on_cpu)

    def _flush(self, name: str) -> None:
        """`S_name ← S_name + cᵀ V` for the waiting block (one stacked product, float64; one
        fused `S ← S + c v` for a block of one)."""
        vectors, coefficients = self._blocks.pop(name, ([], []))
        if not vectors:
            return
        first = vectors[0]
        if len(vectors) == 1:  # S ← S + c v, one fused step
            one = self._sums.get(name)
            if one is None:
                one = self._sums[name] = torch.zeros(first.shape, dtype=torch.float64,
                                                     device=first.device)
            one.add_(first.to(torch.float64), alpha=coefficients[0])
            return
        same = all(v.dtype == first.dtype for v in vectors)
        stacked = torch.stack(vectors if same else [v.to(torch.float64) for v in vectors])
        c = torch.tensor(coefficients, dtype=torch.float64, device=first.device)
        block = (c @ stacked.reshape(len(vectors), -1).to(torch.float64)).view(first.shape)
        acc = self._sums.get(name)
        if acc is None:
            self._sums[name] = block
        else:
            acc.add_(block)

    def __contains__(self, name: str) -> bool:
        """Whether a vector of this name has been added."""
        return name in self._sums or name in self._blocks

    def sum(self, name: str) -> torch.Tensor:
        """`Σ_i w_i scale_i v_i` (float64): the unnormalised sum."""
        self._flush(name)
        return self._sums[name]

    def mean(self, name: str) -> torch.Tensor:
        """`Σ_i p_i v_i` as float32."""
        return (self.sum(name) / self.total).to(torch.float32)

    def scalar(self, name: str) -> float:
        """`Σ_i p_i s_i` for an accumulated scalar."""
        return self.scalar_sums[name] / self.total


PER_CLIENT_COLUMNS = 100
"""**[choice]** Up to this many clients, per-client diagnostics (FedVeca's `τ_i`, BHerd's herding
distances) are metrics columns `<name>_<i>` for every client, NaN for those not in the round;
with more, only the round's clients are reported, as `<name>_per_client: {client: value}` in
diagnostics.jsonl (`per_client_record`), so a round's row does not grow with the clients."""


def per_client_record(values: dict[str, dict[int, float]]) -> dict[str, dict[str, float]]:
    """The round's per-client values of a run with more than `PER_CLIENT_COLUMNS` clients:
    `{<name>_per_client: {str(client): value}}`, a structured diagnostics record."""
    return {f"{name}_per_client": {str(c): v for c, v in vs.items()} for name, vs in values.items()}


def require_replies(count: int, what: str = "aggregate") -> None:
    if count == 0:
        raise ValueError(
            f"{what} needs at least one reply (the round runner keeps the state when none came back)"
        )


__all__ = [
    "BUFFERS",
    "ClientState",
    "ServerState",
    "WeightedMean",
    "require_replies",
    "ALGORITHMS",
    "Algorithm",
    "ClientContext",
    "Message",
    "NoParams",
    "PER_CLIENT_COLUMNS",
    "Reply",
    "RunInfo",
    "per_client_record",
    "sample_weights",
    "weighted_sum",
]
