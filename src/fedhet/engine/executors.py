"""Executors: how a round's independent client halves run (docs/design.md "Executors").

- `sequential`: one client after another, exactly today's loop (`ClientHost.update`).
- `stacked`: the clients' local SGD runs stacked (`fedhet.training.cohort.CohortTrainer`).

The stacked executor keeps every algorithm's `client_update` unchanged. Each client of a chunk
runs as a suspended coroutine: a thread per client and a baton, so exactly one thread runs at a
time, clients start in request order, and the run is deterministic. The client's
`ctx.trainer` is a proxy: `batches` and `gradient` go straight to the shared `LocalTrainer`,
while `sgd(...)` and `full_gradient(...)` park the client. Once every client of the chunk is
parked (or finished), the executor runs all parked `sgd` calls stacked and all parked
`full_gradient` calls stacked (FedVeca's `∇F_i(w_k)`, SCAFFOLD option I; models with
BatchNorm compute them one client at a time), hands each client its result and resumes the
clients one at a time, in order, until each finishes (or parks again).

Which calls fall back to the sequential loop inside the stacked executor, and why:
- `sgd(..., loss_fn=...)` with a loss that is not a `StackableLoss` (MOON's is one): an
  arbitrary callable may call the module in ways the stacked gradient does not express;
- models with dropout, or BatchNorm with `momentum=None` (`unsupported_reason`): their
  per-client randomness or cumulative statistics are not stacked; the whole executor is then
  sequential.
A model that `torch.func` cannot run at all (a user's forward with `.item()`, data-dependent
Python control flow, in-place updates of its buffers) is refused when the executor is built:
one stacked gradient on two samples (`CohortTrainer.check_stackable`) turns torch.func's error
into one line that says to use `executor=sequential`, before any round is run.
Ring topologies hand the executor whole walks (`chains`): each ring's walk runs as one
coroutine calling its devices one after another, and when a hop's SGD leaves the stack the
coroutine is resumed at once, so the next hop's SGD takes the row its predecessor left in the
same stacked call (`CohortTrainer.sgd_many`'s `next_jobs`): a round of every ring, and of
every run of a stack, is one call with no barrier between hops. A HierFAVG edge is a chain
too: its devices run side by side (`many`), and once the last is back the edge averages and
its next iteration's devices join the same call, so edges never wait for each other.

A client that raises is reported as `(client_id, ClientFailure(...))`; the others go on.
`Diverged`, `FedhetError` (a configuration error: the same for every client) and interrupts
still end the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import torch

from fedhet.engine.failures import ClientFailure, Diverged
from fedhet.errors import FedhetError
from fedhet.training.cohort import (
    CohortTrainer,
    rows_that_fit,
    stacks_full_gradients,
    unsupported_reason,
)
from fedhet.training.jobs import Continue, GradJob, SGDJob
from fedhet.training.local import LocalTrainer
from fedhet.training.losses import StackableLoss

if TYPE_CHECKING:
    from fedhet.algorithms.base import Message
    from fedhet.engine.clients import ClientHost
    from fedhet.engine.rounds import Chain

EXECUTORS = ("sequential", "stacked", "auto")

FATAL = (Diverged, FedhetError, KeyboardInterrupt, SystemExit)
"""Not a client fault: a diverged run, a configuration error (one clear line), an interrupt."""


def resolve_device(name: str) -> torch.device:
    """`auto`: CUDA when this torch build sees a GPU, else CPU; `cuda` without one is an error."""
    return device_choice(name)[0]


def device_choice(name: str) -> tuple[torch.device, str]:
    """`resolve_device`, with the reason in words (`fedhet.engine.plan`)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda"), "auto: torch sees a GPU"
        build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible"
        return torch.device("cpu"), f"auto: torch {torch.__version__} ({build}) sees no GPU"
    if name == "cuda" and not torch.cuda.is_available():
        cuda = torch.version.cuda
        build = "a CPU-only build" if cuda is None else f"CUDA {cuda}, no GPU visible"
        raise FedhetError(
            f"device=cuda but torch {torch.__version__} ({build}) has no usable GPU; "
            "run on the CPU with --device cpu (or --device auto; device = \"cpu\" in a settings "
            "file), see docs/gpu.md"
        )
    return torch.device(name), "set"


def choose_executor(
    name: str, device: torch.device, linear: bool, module: torch.nn.Module, workers: int = 1
) -> str:
    """The executor a run uses. `auto`: `stacked` on CUDA, or for a linear model (one whose
    registry entry declares `linear=True`: closed-form gradients; measured on CPU,
    benchmarks/RESULTS.md); else `sequential`. Any choice becomes
    `sequential` when the model cannot be stacked (`unsupported_reason`). `workers > 1` asks
    for the sequential executor over processes (`engine/workers.py`): CPU only, and `auto`
    then means `sequential`."""
    return executor_choice(name, device, linear, module, workers)[0]


def executor_choice(
    name: str, device: torch.device, linear: bool, module: torch.nn.Module | None, workers: int = 1
) -> tuple[str, str]:
    """`choose_executor`, with the reason in words; `module` None: the model is not built yet,
    so whether it can be stacked is not known (the reason says so)."""
    if workers > 1:
        if device.type != "cpu":
            raise FedhetError(
                f"--workers {workers} spreads clients over CPU processes; use --device cpu, or "
                "--workers 1 on a GPU (the stacked executor is the GPU's way)"
            )
        if name == "stacked":
            raise FedhetError(
                f"--workers {workers} runs the sequential executor in processes; use "
                "--executor sequential (or auto) with it, or --workers 1 with --executor stacked"
            )
        return "sequential", f"--workers {workers} runs the sequential executor in processes"
    why = unsupported_reason(module) if module is not None else None
    if why is not None:
        return "sequential", f"the model cannot be stacked ({why})"
    if name != "auto":
        chosen, reason = name, "set"
    elif device.type == "cuda":
        chosen, reason = "stacked", "auto: on CUDA"
    elif linear:
        chosen, reason = "stacked", "auto: a linear model (closed-form gradients)"
    else:
        chosen, reason = "sequential", "auto: on the CPU, not a linear model"
    if module is None and chosen == "stacked":
        reason += "; sequential if the model has dropout or BatchNorm(momentum=None)"
    return chosen, reason


class Executor(Protocol):
    """Where a run's client halves run: the loop (`fedhet.engine.simulation`) hands it each
    round's requests and reads the replies. The in-process executors here and in
    `engine/workers.py` run them over a `ClientHost`; a Flower server's
    (`fedhet.deploy.server_app.FlowerExecutor`) sends them to SuperNodes."""

    name: str

    def run(self, round: int, requests: Sequence[tuple[int, Message]]) -> Iterator[tuple[int, Any]]:
        """Run independent client halves; yield `(client_id, reply)` in request order, or
        `(client_id, ClientFailure)` for a client that raised."""
        ...

    def update(self, client_id: int, message: Message, round: int) -> Message:
        """One client half whose reply the caller needs now (a relayed topology's hop)."""
        ...

    def columns(self) -> dict[str, float]:
        """Columns this executor adds to the metrics row of the round just finished."""
        ...

    def close(self) -> None:
        """Release what the executor holds (worker processes) once the run ends."""
        ...


def failure(client_id: int, round: int, error: BaseException) -> ClientFailure:
    return ClientFailure.of(client_id, round, error)


class InProcess:
    """What the executors that run clients in this process share: one client's update on the
    run's `ClientHost`, no extra metrics columns, nothing to close."""

    def __init__(self, host: ClientHost) -> None:
        self.host = host

    def update(self, client_id: int, message: Message, round: int) -> Message:
        return self.host.update(client_id, message, round)

    def columns(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class SequentialExecutor(InProcess):
    """Today's loop: one client after another, each reply yielded as it is made."""

    name = "sequential"

    def run(self, round: int, requests: Sequence[tuple[int, Message]]) -> Iterator[tuple[int, Any]]:
        for client_id, message in requests:
            try:
                reply = self.host.update(client_id, message, round)
            except FATAL:
                raise
            except Exception as e:  # noqa: BLE001  (one client's fault is not the run's)
                yield client_id, failure(client_id, round, e)  # the round runner logs it
                continue
            yield client_id, reply


# -- the stacked executor ----------------------------------------------------------------------
@dataclass
class _Client:
    client_id: int
    message: Message
    buffers: torch.Tensor | None
    baton: threading.Event = field(default_factory=threading.Event)
    """Set by the executor to let this client's thread run."""
    yielded: threading.Event = field(default_factory=threading.Event)
    """Set by the thread when it parks in `sgd` or finishes."""
    job: SGDJob | GradJob | None = None
    done: bool = False
    reply: Any = None
    error: BaseException | None = None
    thread: threading.Thread | None = None
    parent: _Client | None = None
    """The chain whose fan-out (`_ChainClients.many`) started this client."""
    children: list[_Client] | None = None
    """A chain's clients of its current fan-out, while it waits for them."""


class _ParkingTrainer:
    """`ctx.trainer` of a stacked client: `sgd` parks, the rest goes to the shared trainer."""

    def __init__(self, trainer: LocalTrainer, client: _Client, resume: Callable[[_Client], None]) -> None:
        self._trainer = trainer
        self._client = client
        self._park = resume

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)

    def sgd(self, w0, batches, cfg, transforms=(), on_step=None, loss_fn=None):
        client = self._client
        if loss_fn is not None and not isinstance(loss_fn, StackableLoss):
            # a loss the stack cannot express: run this call sequentially, right here
            model = self._trainer.model
            if client.buffers is not None:
                model.buffers.copy_(client.buffers)
            out = self._trainer.sgd(w0, batches, cfg, transforms, on_step, loss_fn)
            if client.buffers is not None:
                client.buffers = model.buffers.clone()
            return out
        client.job = SGDJob(w0, iter(batches), cfg, transforms, on_step, client.buffers, loss_fn)
        self._park(client)
        job, client.job = client.job, None
        if job.error is not None:
            raise job.error
        if job.buffers_out is not None:  # what the sequential loop leaves in the shared model
            client.buffers = job.buffers_out
            self._trainer.model.buffers.copy_(job.buffers_out)
        assert job.result is not None
        return job.result

    def full_gradient(self, params, indices, chunk=1024, max_batches=0):
        """Park the client until the chunk's full gradients are computed stacked (models with
        BatchNorm: right here, on the shared model holding this client's statistics)."""
        if not stacks_full_gradients(self._trainer.model):
            return self._trainer.full_gradient(params, indices, chunk, max_batches)
        client = self._client
        client.job = GradJob(params, indices, chunk, max_batches)
        self._park(client)
        job, client.job = client.job, None
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result


class StackedExecutor(InProcess):
    """Stacked local SGD over chunks of the cohort (see the module docstring)."""

    name = "stacked"

    def __init__(self, host: ClientHost, chunk: int = 0) -> None:
        super().__init__(host)
        self.chunk = chunk
        self.cohort = CohortTrainer(host.model, host.trainer.x, host.trainer.y, chunk=0, log=host.log)
        self.cohort.check_stackable()  # a model torch.func cannot run: one line, before any round
        self.shared: Any = None
        """A `fedhet.engine.stacked_runs.SharedCohort` while this run steps in a stack of runs: parked
        clients then go to it, to be stacked with the other runs' clients."""

    def _chunk_size(self, n: int) -> int:
        if self.chunk > 0:
            return self.chunk
        vectors = 4 if self.host.local.client_optimizer != "sgd" else 3  # Adam: w, g, m and v
        return max(1, min(n, rows_that_fit(self.host.model.dim, self.host.model.params.device,
                                           vectors)))

    def run(self, round: int, requests: Sequence[tuple[int, Message]]) -> Iterator[tuple[int, Any]]:
        size = self._chunk_size(len(requests))
        self.cohort.chunk = size
        for start in range(0, len(requests), size):
            yield from self._run_chunk(round, requests[start : start + size])

    def chains(self, round: int, chains: Sequence[Chain]) -> None:
        """Run independent chains of client halves (`fedhet.engine.rounds.Chain`: a ring's
        walk, a HierFAVG edge's iterations), each as one coroutine. A client's local SGD parks;
        when it leaves the stack its client is resumed at once and what the chain does next
        (the next hop; the edge's average and its next iteration, once the last of its devices
        is back) parks SGD that joins the same stacked call (`CohortTrainer.sgd_many`'s
        `next_jobs`), so a round of every chain, and of every run of a stack, is one call with
        no barrier between hops or between edges."""
        size = self._chunk_size(len(chains))
        # a chain may fan out to several rows (a HierFAVG edge's devices)
        self.cohort.chunk = self._chunk_size(max(len(chains), len(self.host.client_indices)))
        for start in range(0, len(chains), size):
            part = chains[start : start + size]
            coroutines = [_Client(-1, None, None) for _ in part]  # type: ignore[arg-type]
            self._drive(coroutines, [partial(self._chain_main, c, chain, round)
                                     for c, chain in zip(coroutines, part, strict=True)])
            for c in coroutines:
                if c.error is not None:
                    raise c.error

    def _chain_main(self, coroutine: _Client, chain: Chain, round: int) -> None:
        """A chain's coroutine: its clients run through `_ChainClients` (`FATAL` errors end
        the chain and the run; any other client error comes back as a `ClientFailure`)."""
        try:
            chain(_ChainClients(self, coroutine, round))
        except BaseException as e:  # noqa: BLE001  (reported to the executor's thread)
            coroutine.error = e
        finally:
            coroutine.done = True
            coroutine.yielded.set()

    # -- one chunk ------------------------------------------------------------------------
    def _run_chunk(self, round: int, requests: Sequence[tuple[int, Message]]):
        host = self.host
        clients = [_Client(cid, msg, host.initial_buffers(msg)) for cid, msg in requests]
        self._drive(clients, [partial(self._client_main, c, round) for c in clients])
        for client in clients:
            if client.error is not None:
                if isinstance(client.error, FATAL):
                    raise client.error
                yield client.client_id, failure(client.client_id, round, client.error)
            else:
                yield client.client_id, host.finish(client.client_id, client.reply, client.buffers)

    def _drive(self, clients: list[_Client], mains: list[Callable[[], None]]) -> None:
        """Start each client's coroutine (`mains[i]` on a thread of its own, one running at a
        time, in order), then run what they park, stacked, until every one has finished: a
        client whose job leaves the stack is resumed at once (`_next_jobs`); what it parks
        next joins the stack or waits for the next round of this loop."""
        for client, main in zip(clients, mains, strict=True):
            client.thread = threading.Thread(target=main, daemon=True,
                                             name=f"fedhet-client-{client.client_id}")
            self._switch_to(client, start=True)
        while True:
            live = _tree(clients)
            waiting = [c.job for c in live if c.job is not None and not c.job.finished]
            if not waiting:
                break
            sgd = [job for job in waiting if isinstance(job, SGDJob)]
            try:
                if sgd:
                    (self.shared or self.cohort).sgd_many(sgd, self._next_jobs(clients))
            except Exception as e:  # noqa: BLE001  (the stacked step itself failed)
                for job in sgd:
                    if not job.finished:
                        job.error = e
            self.cohort.full_gradients([c.job for c in _tree(clients)
                                        if isinstance(c.job, GradJob) and not c.job.finished])
            for client in _tree(clients):
                if not client.done and client.job is not None and client.job.finished:
                    self._resume(client)
        for client in clients:
            assert client.thread is not None
            client.thread.join()

    def _resume(self, client: _Client) -> None:
        """Resume `client` until it parks again or finishes; a chain whose fan-out is then all
        back is resumed in turn (its average, its next iteration)."""
        self._switch_to(client)
        parent = client.parent
        while client.done and parent is not None and parent.children is not None \
                and all(k.done for k in parent.children):
            parent.children = None
            self._switch_to(parent)
            client, parent = parent, parent.parent

    def _next_jobs(self, clients: list[_Client]) -> Continue:
        """The cohort's `next_jobs` for `clients`: resume the client of each job that left the
        stack, and hand back the SGD jobs parked since (its next one, or a chain's next
        fan-out)."""
        def resume(gone: list[SGDJob]) -> list[SGDJob]:
            made: list[SGDJob] = []
            for job in gone:
                live = _tree(clients)
                owner = next((c for c in live if c.job is job), None)
                if owner is None:
                    continue
                before = {id(c.job) for c in live if c.job is not None}
                self._resume(owner)
                made += [c.job for c in _tree(clients) if isinstance(c.job, SGDJob)
                         and not c.job.finished and id(c.job) not in before]
            return made

        return resume

    def _switch_to(self, client: _Client, start: bool = False) -> None:
        """Give `client` the baton and wait until it parks again or finishes."""
        if client.buffers is not None:
            self.host.model.buffers.copy_(client.buffers)
        client.yielded.clear()
        if start:
            assert client.thread is not None, "start() makes every client's thread first"
            client.thread.start()
        else:
            client.baton.set()
        client.yielded.wait()

    def _park(self, client: _Client) -> None:
        """Called on the client's thread: hand the baton back and wait to be resumed."""
        client.baton.clear()
        client.yielded.set()
        client.baton.wait()

    def _client_main(self, client: _Client, round: int) -> None:
        """A star round's client: its half, with `ctx.trainer` parking its SGD."""
        try:
            trainer = _ParkingTrainer(self.host.trainer, client, self._park)
            client.reply = self.host.run_client(client.client_id, client.message, round, trainer)
        except BaseException as e:  # noqa: BLE001  (reported to the executor's thread)
            client.error = e
        finally:
            client.done = True
            client.yielded.set()


class _ChainClients:
    """What a chain calls its clients with (`fedhet.engine.rounds.ChainClients`), on the
    chain's coroutine: one client at a time, run right here (`__call__`), or several at once
    (`many`), each on a coroutine of its own whose SGD parks in the stack while the chain
    waits for all of them."""

    def __init__(self, executor: StackedExecutor, coroutine: _Client, round: int) -> None:
        self.executor = executor
        self.coroutine = coroutine
        self.round = round
        self.trainer = _ParkingTrainer(executor.host.trainer, coroutine, executor._park)

    def __call__(self, client_id: int, message: Message) -> Message | ClientFailure:
        host, coroutine = self.executor.host, self.coroutine
        coroutine.client_id = client_id
        coroutine.buffers = host.initial_buffers(message)
        if coroutine.buffers is not None:
            host.model.buffers.copy_(coroutine.buffers)
        try:
            reply = host.run_client(client_id, message, self.round, self.trainer)
        except FATAL:
            raise
        except Exception as e:  # noqa: BLE001  (one client's fault is not the chain's)
            return failure(client_id, self.round, e)
        return host.finish(client_id, reply, coroutine.buffers)

    def many(self, requests: Sequence[tuple[int, Message]]) -> list[tuple[int, Message | ClientFailure]]:
        """Every request's reply (or `ClientFailure`), in request order."""
        executor, host = self.executor, self.executor.host
        kids = [_Client(cid, msg, host.initial_buffers(msg), parent=self.coroutine)
                for cid, msg in requests]
        self.coroutine.children = kids
        for kid in kids:
            kid.thread = threading.Thread(target=executor._client_main, args=(kid, self.round),
                                          daemon=True, name=f"fedhet-client-{kid.client_id}")
            executor._switch_to(kid, start=True)
        if all(k.done for k in kids):
            self.coroutine.children = None
        else:
            executor._park(self.coroutine)  # resumed once the last of them is done
        out: list[tuple[int, Message | ClientFailure]] = []
        for kid in kids:
            assert kid.thread is not None
            kid.thread.join()
            if kid.error is not None:
                if isinstance(kid.error, FATAL):
                    raise kid.error
                out.append((kid.client_id, failure(kid.client_id, self.round, kid.error)))
            else:
                out.append((kid.client_id, host.finish(kid.client_id, kid.reply, kid.buffers)))
        return out


def _tree(clients: list[_Client]) -> list[_Client]:
    """`clients` not yet done and, under each, the clients of its fan-out (depth first)."""
    out: list[_Client] = []
    for c in clients:
        if c.done:
            continue
        out.append(c)
        if c.children:
            out += _tree(c.children)
    return out


def make_executor(host: ClientHost, name: str, chunk: int = 0) -> SequentialExecutor | StackedExecutor:
    """The executor `name` (`sequential` or `stacked`) over `host`'s clients."""
    if name == "stacked":
        return StackedExecutor(host, chunk)
    return SequentialExecutor(host)


__all__ = [
    "EXECUTORS", "StackedExecutor", "Executor", "SequentialExecutor", "choose_executor", "device_choice",
    "executor_choice", "make_executor", "resolve_device",
]
