"""A kit for testing an algorithm without the engine: fake runs, clients and replies.

An algorithm's two halves (`fedhet.algorithms.base`) only see messages, a `RunInfo`, a
`ClientContext` and their own states, so each can be tested alone, on numbers small enough to
check by hand:

- `make(algorithm, params, run)`: the algorithm object, its parameters validated as the CLI
  validates them; `run_info(dim=…)` is a `RunInfo` with sensible defaults.
- `fake_reply(client_id, delta=[…], num_samples=…)` and `fake_replies(delta=[[…], […]], …)`
  build the replies an `aggregate` reads; `server_step(algorithm, state, replies)` calls it the
  way the engine does (the replies as a one-pass generator) and checks the contract: a new state
  of the same class, the old one left as it was.
- `fake_context(…)` is a real `ClientContext` over a few samples of a tiny model (least squares
  by default, `½ (wᵀx − y)²`, whose gradient `Xᵀ(Xw − y)/|B|` a test can write down), so
  `client_update` trains for real; `fake_clients(n, …)` gives `n` of them sharing one trainer, as
  the engine's clients do. `client_step` calls `client_update` and checks that the message it
  was sent is left alone (the engine hands the same `w` to every client).
- `one_round(algorithm, state, clients)` runs a whole round: `configure`, `client_update` for
  each client, `aggregate`.

Example: FedAvg's new model is the `D_i`-weighted mean of the clients' changes::

    >>> import torch
    >>> from fedhet.testing import fake_replies, make, run_info, server_step
    >>> fedavg = make("fedavg", run=run_info(dim=2))
    >>> state = fedavg.init(torch.zeros(2))
    >>> replies = fake_replies(delta=[[1.0, 0.0], [0.0, 2.0]], num_samples=[1, 3])
    >>> new, diagnostics = server_step(fedavg, state, replies)
    >>> new.w.tolist()
    [0.25, 1.5]

and a client's local SGD lowers its loss::

    >>> from fedhet.testing import client_step, fake_context, local_loss
    >>> ctx = fake_context(samples=16, features=3, tau=20, lr=0.1)
    >>> w0 = torch.zeros(3)
    >>> reply, _ = client_step(fedavg, fedavg.configure(fedavg.init(w0), 0, 0), ctx)
    >>> local_loss(ctx, w0 + reply.tensors["delta"]) < local_loss(ctx, w0)
    True

The kit imports the algorithm and training layers and torch only (no engine, no runs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientContext,
    ClientState,
    Message,
    Reply,
    RunInfo,
    ServerState,
)
from fedhet.models.registry import objective
from fedhet.registry import build_params
from fedhet.training.flat import FlatModel, Layer
from fedhet.training.local import LocalTrainer, SGDConfig


# -- the run ------------------------------------------------------------------------------------
def run_info(
    dim: int | None = None, *, num_clients: int = 2, rounds: int = 1, lr: float = 0.1,
    momentum: float = 0.0, weight_decay: float = 0.0, seed: int = 0,
    layers: Sequence[Layer] | None = None, context: ClientContext | None = None,
    client_optimizer: str = "sgd",
) -> RunInfo:
    """What the server half knows about a run (`RunInfo`).

    `dim` is the length of the flat parameter vector; without `layers` it is one fully connected
    layer `weight` of shape `(dim,)`. `context` (a `fake_context`) takes `dim`, `layers`, `lr`,
    `momentum`, `weight_decay` and `client_optimizer` from that client's model and local step
    settings instead.

    >>> run_info(dim=3, num_clients=4).layers
    (Layer(name='weight', start=0, stop=3, shape=(3,), kind='fc'),)
    """
    if context is not None:
        model = context.trainer.model
        dim, layers = model.dim, model.layers
        lr, momentum, weight_decay = context.sgd.lr, context.sgd.momentum, context.sgd.weight_decay
        client_optimizer = context.sgd.optimizer
    if dim is None:
        raise ValueError("run_info needs dim= (the length of the parameter vector) or context=")
    if layers is None:
        layers = (Layer("weight", 0, dim, (dim,), "fc"),)
    return RunInfo(
        num_clients=num_clients, rounds=rounds, lr=lr, momentum=momentum,
        weight_decay=weight_decay, seed=seed, dim=dim, layers=tuple(layers),
        client_optimizer=client_optimizer,
    )


def make(
    algorithm: str | type[Algorithm], params: Any = None, run: RunInfo | None = None
) -> Algorithm:
    """An algorithm object, as the engine builds it.

    `algorithm` is a registered name (`"fednova"`) or an `Algorithm` subclass; `params` a dict of
    its parameters (checked and typed like `--set algorithm.mu=0.1`, `validate()` included), an
    already built parameter object, or None for the defaults. A class that is not registered
    takes `params` as given (None: no parameters). `run` defaults to `run_info(dim=2)`.

    >>> make("fednova", {"mu": "0.1"}).params.mu
    0.1
    """
    entry = _entry_of(algorithm)
    cls = entry.factory if entry is not None else algorithm
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"make needs an algorithm name or an Algorithm subclass, got {algorithm!r}")
    if entry is not None and (params is None or isinstance(params, Mapping)):
        params = build_params(entry.params, dict(params or {}), "algorithm")
    return cls(params, run if run is not None else run_info(dim=2))


def _entry_of(algorithm: str | type[Algorithm]):
    """The registry entry of a name or a registered class (None: a class never registered)."""
    if isinstance(algorithm, str):
        return ALGORITHMS.get(algorithm)
    return next((e for e in ALGORITHMS if e.factory is algorithm), None)


# -- replies ------------------------------------------------------------------------------------
def _as_value(name: str, value: Any) -> torch.Tensor | float:
    """A reply entry: a number is a scalar, anything array-like a float32 tensor (kept as given
    when it already is a tensor)."""
    if isinstance(value, bool):
        raise TypeError(f"{name}={value!r}: a reply holds tensors and numbers, not booleans")
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    if isinstance(value, torch.Tensor):
        return value
    return torch.as_tensor(np.asarray(value, dtype=np.float32))


def fake_reply(client_id: int = 0, *, num_samples: float = 1.0, **values: Any) -> Reply:
    """The `Reply` of client `client_id`: each keyword that is a number becomes a scalar, each
    list, array or tensor a tensor; `num_samples` (`D_i`, read by the sample weights) is 1 unless
    given.

    >>> r = fake_reply(3, delta=[1.0, -1.0], num_samples=10, steps=4)
    >>> r.client_id, r.message.tensors["delta"].tolist(), r.message.scalars
    (3, [1.0, -1.0], {'num_samples': 10.0, 'steps': 4.0})
    """
    message = Message()
    message.scalars["num_samples"] = float(num_samples)
    for name, value in values.items():
        v = _as_value(name, value)
        if isinstance(v, torch.Tensor):
            message.tensors[name] = v
        else:
            message.scalars[name] = v
    return Reply(client_id, message)


def fake_replies(client_ids: Sequence[int] | None = None, **columns: Sequence[Any]) -> list[Reply]:
    """One reply per client from columns: each keyword holds one entry per client (a tensor's
    rows, or a list), given to `fake_reply` under that name. Client ids are `0, 1, …` unless
    `client_ids` names them.

    >>> rs = fake_replies(delta=[[1.0, 0.0], [0.0, 2.0]], num_samples=[1, 3], client_ids=[0, 5])
    >>> [(r.client_id, r.message.scalars["num_samples"]) for r in rs]
    [(0, 1.0), (5, 3.0)]
    """
    lengths = {name: len(column) for name, column in columns.items()}
    if client_ids is not None:
        lengths["client_ids"] = len(client_ids)
    if not lengths or len(set(lengths.values())) != 1:
        raise ValueError(f"fake_replies needs columns of one length (one entry per client), got {lengths}")
    n = next(iter(lengths.values()))
    ids = list(client_ids) if client_ids is not None else list(range(n))
    return [fake_reply(ids[i], **{name: column[i] for name, column in columns.items()})
            for i in range(n)]


# -- clients ------------------------------------------------------------------------------------
class LeastSquares(nn.Module):
    """`f(w; x, y) = ½ (wᵀx − y)²`, averaged over a batch: one weight per feature, no bias, so
    the mini-batch gradient is `Xᵀ(Xw − y)/|B|` and a test can follow every step by hand."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * (output - target).pow(2).mean()

    def predict(self, output: torch.Tensor) -> torch.Tensor:
        return output


def least_squares_gradient(
    x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """`∇f(w) = Xᵀ(Xw − y)/n` of `LeastSquares` on `(x, y)`, in float64: the hand computation
    a test compares local steps with."""
    x, y, w = x.double(), y.double(), w.double()
    return x.T @ (x @ w - y) / len(y)


def _data(
    samples: int, features: int, classes: int, seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded samples: targets of a random linear map plus noise (regression), or its arg-max
    (`classes > 0`)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    if classes:
        w = torch.randn(features, classes, generator=gen)
        return x, (x @ w).argmax(dim=1)
    w = torch.randn(features, generator=gen)
    return x, x @ w + 0.1 * torch.randn(samples, generator=gen)


def _model(
    model: nn.Module | None, features: int, classes: int, x: torch.Tensor, seed: int
) -> nn.Module:
    if model is not None:
        return model
    if classes:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(x.shape[1:]), classes))
    return LeastSquares(features)


def fake_clients(
    num_clients: int = 2, *, x: torch.Tensor | None = None, y: torch.Tensor | None = None,
    sizes: Sequence[int] | None = None, samples: int = 8, features: int = 3, classes: int = 0,
    model: nn.Module | None = None, round: int = 0, tau: int | Sequence[int] = 3,
    batch_size: int = 4, lr: float = 0.1, momentum: float = 0.0, weight_decay: float = 0.0,
    seed: int = 0, batch_order: str = "reshuffle",
) -> list[ClientContext]:
    """`num_clients` contexts over one tiny dataset and one shared model, as the engine makes them.

    The data is `(x, y)` when given, else `samples` seeded samples per client with `features`
    features: least-squares targets (`LeastSquares`, starting from `w = 0`), or class labels for a
    logistic model when `classes > 0`. `sizes` gives each client's number of samples (`D_i`;
    default `samples` each, or `x` split evenly); clients own consecutive slices. `model` replaces
    the tiny model (any `nn.Module`; a `loss(output, target)` method replaces cross-entropy, as in
    `fedhet.models.registry.objective`). `tau` is the local step count, one for all or one per
    client; `batch_size`, `lr`, `momentum`, `weight_decay`, `seed` and `batch_order` are the
    run's settings. The model's starting parameters are `clients[0].trainer.model.params`.

    >>> a, b = fake_clients(2, sizes=[4, 12], tau=[1, 3])
    >>> (a.num_samples, a.tau), (b.num_samples, b.tau)
    ((4, 1), (12, 3))
    """
    if sizes is None:
        sizes = [samples] * num_clients if x is None else _even(len(x), num_clients)
    if len(sizes) != num_clients:
        raise ValueError(f"sizes needs one entry per client ({num_clients}), got {len(sizes)}")
    if x is None:
        x, y = _data(sum(sizes), features, classes, seed)
    elif y is None:
        raise ValueError("fake_clients needs y with x")
    if sum(sizes) > len(x):
        raise ValueError(f"sizes ask for {sum(sizes)} samples, x has {len(x)}")
    taus = [tau] * num_clients if isinstance(tau, int) else list(tau)
    if len(taus) != num_clients:
        raise ValueError(f"tau needs one entry per client ({num_clients}), got {len(taus)}")
    module = _model(model, x.shape[1] if x.dim() > 1 else 1, classes, x, seed)
    trainer = LocalTrainer(FlatModel(module), x, y)
    starts = np.cumsum([0, *sizes])
    sgd = SGDConfig(lr, momentum, weight_decay)
    return [
        ClientContext(
            client_id=i, round=round, indices=torch.arange(int(starts[i]), int(starts[i + 1])),
            trainer=trainer, tau=taus[i], batch_size=batch_size,
            sgd=dataclasses.replace(sgd), seed=seed, batch_order=batch_order,
        )
        for i in range(num_clients)
    ]


def _even(n: int, parts: int) -> list[int]:
    return [n // parts + (i < n % parts) for i in range(parts)]


def fake_context(
    x: torch.Tensor | None = None, y: torch.Tensor | None = None, *, client_id: int = 0,
    samples: int = 8, features: int = 3, classes: int = 0, model: nn.Module | None = None,
    round: int = 0, tau: int = 3, batch_size: int = 4, lr: float = 0.1, momentum: float = 0.0,
    weight_decay: float = 0.0, seed: int = 0, batch_order: str = "reshuffle",
) -> ClientContext:
    """One client's `ClientContext` over a tiny model and data (`fake_clients` with one client):
    `client_update` runs for real on it.

    >>> ctx = fake_context(samples=6, features=2, tau=4, batch_size=3)
    >>> ctx.num_samples, ctx.tau, ctx.trainer.model.dim
    (6, 4, 2)
    """
    ctx = fake_clients(
        1, x=x, y=y, samples=samples, features=features, classes=classes, model=model,
        round=round, tau=tau, batch_size=batch_size, lr=lr, momentum=momentum,
        weight_decay=weight_decay, seed=seed, batch_order=batch_order,
    )[0]
    ctx.client_id = client_id
    return ctx


def local_loss(ctx: ClientContext, w: torch.Tensor) -> float:
    """The client's mean training loss `F_i(w)` over all its samples (its model's objective)."""
    model = ctx.trainer.model
    saved = model.params.clone()
    try:
        model.params.copy_(w)
        with torch.no_grad():
            module = model.module
            x, y = ctx.trainer.x[ctx.indices], ctx.trainer.y[ctx.indices]
            return float(objective(module, module(x), y))
    finally:
        model.params.copy_(saved)


# -- calling the halves as the engine does --------------------------------------------------------
def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor inside a state or message (dataclass fields, dicts, lists)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name))]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _unchanged(before: list[torch.Tensor], after: list[torch.Tensor], what: str) -> None:
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        if not torch.equal(a, b):
            raise AssertionError(
                f"{what} changed a tensor it was given (#{i}) in place; compute a new one "
                "(the engine shares these tensors between clients, rounds and checkpoints)"
            )


def _one_pass(replies: Iterable[Reply]) -> Iterator[Reply]:
    yield from replies


def server_step(
    algorithm: Algorithm, state: ServerState, replies: Iterable[Reply], round: int = 0
) -> tuple[ServerState, dict[str, Any]]:
    """`algorithm.aggregate(state, round, replies)` as the round runner calls it: the replies
    as a one-pass generator. Raises `AssertionError` when the aggregate breaks the contract:
    the result is not a state of `state`'s class, or a tensor of `state` or of a reply was
    changed in place."""
    replies = list(replies)
    before = [t.clone() for t in _tensors(state)]
    sent = [t.clone() for r in replies for t in _tensors(r.message.tensors)]
    new, diagnostics = algorithm.aggregate(state, round, _one_pass(replies))
    if not isinstance(new, type(state)):
        raise AssertionError(
            f"{type(algorithm).__name__}.aggregate returned a {type(new).__name__}, not a "
            f"{type(state).__name__}; return dataclasses.replace(state, ...)"
        )
    _unchanged(before, _tensors(state), f"{type(algorithm).__name__}.aggregate")
    _unchanged(sent, [t for r in replies for t in _tensors(r.message.tensors)],
               f"{type(algorithm).__name__}.aggregate")
    return new, diagnostics


_INIT = object()


def client_step(
    algorithm: Algorithm, message: Message, ctx: ClientContext, state: Any = _INIT
) -> tuple[Message, ClientState | None]:
    """`algorithm.client_update(message, ctx, state)`, `state` defaulting to
    `client_init(ctx.client_id)`. Raises `AssertionError` when the update changed a tensor of
    the message in place (the engine sends the same `w` to every client) or did not reply with
    a `Message`."""
    if state is _INIT:
        state = algorithm.client_init(ctx.client_id)
    before = [t.clone() for t in _tensors(message.tensors)]
    reply, new_state = algorithm.client_update(message, ctx, state)
    _unchanged(before, _tensors(message.tensors), f"{type(algorithm).__name__}.client_update")
    if not isinstance(reply, Message):
        raise AssertionError(
            f"{type(algorithm).__name__}.client_update replied with a {type(reply).__name__}, "
            "not a Message"
        )
    return reply, new_state


@dataclass
class Round:
    """What `one_round` produced."""

    state: ServerState
    """The server state after `aggregate`."""
    diagnostics: dict[str, Any]
    replies: list[Reply]
    client_states: dict[int, Any]
    """Each client's state after its update (the ones passed in, updated)."""


def one_round(
    algorithm: Algorithm, state: ServerState, clients: Sequence[ClientContext],
    round: int = 0, client_states: Mapping[int, Any] | None = None,
) -> Round:
    """One round of a star algorithm without the engine: `configure` for each client,
    `client_step` on its context, then `server_step` over the replies in client order.
    `client_states` holds the clients' states from an earlier round (a client without one
    starts from `client_init`); each context's `round` is set to `round`.

    >>> fedavg = make("fedavg")
    >>> clients = fake_clients(2, features=2)
    >>> out = one_round(fedavg, fedavg.init(torch.zeros(2)), clients)
    >>> sorted(out.diagnostics)
    ['local_steps_mean', 'local_train_loss']
    """
    states = dict(client_states or {})
    replies = []
    for ctx in clients:
        ctx.round = round
        message = algorithm.configure(state, ctx.client_id, round)
        prior = states.get(ctx.client_id, _INIT)
        reply, states[ctx.client_id] = client_step(algorithm, message, ctx, prior)
        replies.append(Reply(ctx.client_id, reply))
    new, diagnostics = server_step(algorithm, state, replies, round)
    return Round(new, diagnostics, replies, states)


__all__ = [
    "LeastSquares",
    "Round",
    "client_step",
    "fake_clients",
    "fake_context",
    "fake_replies",
    "fake_reply",
    "least_squares_gradient",
    "local_loss",
    "make",
    "one_round",
    "run_info",
    "server_step",
]
