"""The sequential executor spread over worker processes (`--workers N`, CPU only).

A round's independent client halves run in `N` forked processes, each holding a copy of the
run (data, model, trainer) made when the pool starts. A task carries what the client half reads
— its id, the downlink message, the round and the client's own state — and brings back the
reply and the client's new state; nothing else crosses. Replies are yielded in request order,
so the server aggregates them in the same order as `--workers 1`, and each client draws from
the same seeded streams (`stream_seed`) in whichever process it runs: the run is bit-identical
to one worker when every process computes with the same number of threads (run with
`OMP_NUM_THREADS=1`, as `make test` does; the workers use `max(1, threads // N)` each).

Model-sized tensors do not go through pickling: a tensor that several downlinks of a round
share (the global model, SCAFFOLD's `c`) is copied once into a shared-memory slot the workers
inherited at the fork (`SharedDownlink`), and a task hands its model-sized reply tensors
(`delta`, …) back through reply slots lent to it until the parent has copied them out. The
values are the same bits; only the copying changes (the MLP row of `benchmarks/bench_cohort.py`
went from 1.41× to 1.63–1.91× with two workers).

At most `8 N` tasks are in flight (`IN_FLIGHT`), so the replies waiting for the server are bounded as in the
streaming round runners. A client that raises comes back as a `ClientFailure` (the round goes
on without it); `Diverged`, `FedhetError` and interrupts end the run as in one process. The
pool is forked on first use (`fork`: the copy of the run costs nothing up front) and closed
when the run ends. FedSR's rings reach the workers hop by hop, hop `h` of every edge's ring
together; the single ring of `ring` (one client per call) stays in the main process.

`--workers auto` (0, the default) is `auto_workers`: the usable cores when the run computes on
the CPU with the sequential executor and both a round's estimated cost (`round_cost`) and the
whole run's pass a measured threshold, else 1; the Simulation logs the choice and why in one
line wherever it weighed the work (with 2 or more cores, on the CPU's sequential executor).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult
from typing import TYPE_CHECKING, Any

import torch

from fedhet.algorithms.base import Message
from fedhet.engine.executors import FATAL, SequentialExecutor, failure
from fedhet.errors import FedhetError

if TYPE_CHECKING:
    from fedhet.engine.clients import ClientHost

IN_FLIGHT = 8
"""Clients in flight per worker: enough that one large client at the head of the queue does not
leave the other workers idle, few enough that waiting replies stay a bounded multiple of one."""

_RUN: ClientHost | None = None
"""The run a forked worker computes with (set in the parent just before the fork)."""

_SLOTS: list[torch.Tensor] = []
"""The shared-memory slots of `SharedDownlink` a forked worker inherited."""

_REPLY_SLOTS: list[torch.Tensor] = []
"""Shared-memory slots for model-sized reply tensors, lent to one task at a time."""

REPLY_SLOTS_PER_TASK = 2
"""Model-sized reply tensors a task may hand back through shared memory (`delta`, SCAFFOLD's
`delta_c`, FedVeca's `G` and `grad`); further ones are pickled."""

SHARED_SLOTS = 4
"""Model-sized tensors a round's downlinks may share through shared memory (`w`, SCAFFOLD's
`c`, FedVeca's previous gradient, …)."""


CORES_ENV = "FEDHET_CORES"
"""Cores a run may use (`usable_cores`): the grid runner sets it in each of its job processes
to their share of the machine, and a user may set it to cap `--workers auto`."""

AUTO_MIN_WORK = 3e8
"""**[measured]** `--workers auto` spreads a run over the cores only when a round's estimated
cost (`round_cost`) is at least this. On this project's idle 2-core VM, commit f936243
(`benchmarks/bench_workers.py`, docs/gpu.md), two processes ran a round 0.78–1.22× as fast as
one below it (4e7–2e8) and 0.98–1.93× from 3.7e8 on (0.98×: 100 clients of one step each)."""

AUTO_MIN_RUN_WORK = 1e10
"""**[measured]** ... and the whole run's (`rounds ×` a round's) at least this: the pool costs
0.1–0.4 s to start, once. Whole runs whose rounds were large enough ran 0.90–1.58× as fast
below it (2e9–9e9) and 1.11–1.80× from 1.1e10 on (`make demo`'s runs, 3.1e10 each: 1.42×)."""

STEP_COST = 4e6
"""**[measured]** The fixed cost of one local SGD step (Python, autograd and optimiser dispatch)
in multiply-adds that take as long: a step of the MLP 784-h-h-10 at B = 32 took 0.58–0.69 ms
at h = 16 (B·d = 4e5) and 1.15 ms at h = 200 (6.4e6) on this project's 2-core VM, one thread,
≈ 1e-10 s a multiply-add on top of ≈ 0.5 ms a step. Without it a small model's many cheap
steps look like no work (100 clients × 600 samples at h = 16: 7.5e8 without, 7.9e9 with; two
processes ran it 1.4–1.8× as fast)."""


def usable_cores() -> int:
    """Cores this process may run on (`sched_getaffinity`), or `$FEDHET_CORES` when set: a
    grid job's share of them (`fedhet.runs.runner`)."""
    raw = os.environ.get(CORES_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise FedhetError(f"{CORES_ENV} must be a whole number ≥ 1, got {raw!r}")
        return int(raw)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def round_cost(
    clients_per_round: int, steps: Sequence[int], sizes: Sequence[int], batch_size: int, dim: int
) -> float:
    """A round's estimated local training, in multiply-adds:
    `m · mean_i(τ_i · (min(B, n_i) · d + STEP_COST))` for `m` clients a round, client `i` taking
    `τ_i` steps (`steps`) on batches of `min(B, n_i)` of its `n_i` samples (`sizes`) through a
    model of `d` parameters (one multiply-add per parameter and sample: exact for linear layers,
    an underestimate for convolutions), each step also costing `STEP_COST`."""
    if not steps:
        return 0.0
    per_client = sum(
        t * (min(batch_size, n) * dim + STEP_COST) for t, n in zip(steps, sizes, strict=True)
    ) / len(steps)
    return clients_per_round * per_client


def auto_workers(
    cost: float, rounds: int, clients_per_round: int, cores: int, device: str, executor: str,
    requested: str,
) -> tuple[int, str | None]:
    """`--workers auto`: the processes a run's rounds are spread over, and why, in words.

    The usable `cores` (at most one per client of a round) when the run computes on the CPU
    with the sequential executor (`executor`: the one `choose_executor` resolved; `requested`:
    the one asked for), there are 2 or more of them, a round's estimated `cost` (`round_cost`)
    is at least `AUTO_MIN_WORK` and the run's (`rounds · cost`) at least `AUTO_MIN_RUN_WORK`;
    else 1. The reason is None where there was nothing to weigh (a GPU, the stacked executor,
    fewer than 2 cores or clients a round): 1 goes without saying there. A pure function of its
    arguments, so the same settings on the same cores always choose the same (the choice sets
    each process's torch threads, `threads // N`)."""
    n = min(cores, clients_per_round)
    if device != "cpu" or requested == "stacked" or executor != "sequential" or n < 2:
        return 1, None
    if cost < AUTO_MIN_WORK:
        return 1, f"a round's work ~{cost:.1e} multiply-adds < {AUTO_MIN_WORK:.0e}"
    if rounds * cost < AUTO_MIN_RUN_WORK:
        return 1, (f"the run's work ~{rounds * cost:.1e} multiply-adds ({rounds} rounds) < "
                   f"{AUTO_MIN_RUN_WORK:.0e}: too little to pay for starting the workers")
    return n, (f"a round's work ~{cost:.1e} multiply-adds ≥ {AUTO_MIN_WORK:.0e}, the run's "
               f"~{rounds * cost:.1e} ≥ {AUTO_MIN_RUN_WORK:.0e}, {cores} usable cores")


@dataclass(frozen=True)
class _Slot:
    """Stands for a downlink tensor held in shared-memory slot `index`."""

    index: int


class SharedDownlink:
    """Tensors that several downlinks of a round carry (the global model, control variates):
    copied once a round into shared memory that the workers inherited when they were forked,
    and sent as a slot number, instead of being pickled once per client. A worker copies the
    slot out before the client runs, so the client sees the same values as in one process."""

    def __init__(self, dim: int, slots: int = SHARED_SLOTS) -> None:
        self.dim = dim
        self.slots = [torch.zeros(dim).share_memory_() for _ in range(slots)]

    def pack(self, requests: Sequence[tuple[int, Message]]) -> list[tuple[int, Message]]:
        """`requests` with every flat float32 CPU tensor of `dim` elements that two or more of
        them hold (the same object) moved into a slot, as long as slots are free."""
        seen: dict[int, list[torch.Tensor]] = {}
        for _, message in requests:
            for t in message.tensors.values():
                if t.dtype == torch.float32 and t.device.type == "cpu" and t.dim() == 1 \
                        and t.numel() == self.dim:
                    seen.setdefault(id(t), []).append(t)
        shared = [ts[0] for ts in seen.values() if len(ts) > 1][: len(self.slots)]
        slot_of = {}
        for k, t in enumerate(shared):
            self.slots[k].copy_(t)
            slot_of[id(t)] = _Slot(k)
        if not slot_of:
            return list(requests)
        return [(c, _with_slots(m, slot_of)) for c, m in requests]


def _with_slots(message: Message, slot_of: dict[int, _Slot]) -> Message:
    """`message` with each tensor that went into a slot replaced by its `_Slot`, which stands
    for the tensor until `_unpack` (so the message's tensors are typed `Any` here)."""
    tensors: dict[str, Any] = {n: slot_of.get(id(t), t) for n, t in message.tensors.items()}
    return Message(tensors, message.scalars)


def _unpack(message: Message) -> Message:
    """A downlink with its slots copied out of shared memory (`SharedDownlink.pack`)."""
    if not any(isinstance(t, _Slot) for t in message.tensors.values()):
        return message
    tensors = {
        n: _SLOTS[t.index].clone() if isinstance(t, _Slot) else t for n, t in message.tensors.items()
    }
    return Message(tensors, message.scalars)


def _init_worker(threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    torch.set_num_threads(threads)


def _to_slots(reply: Message, slots: Sequence[int]) -> Message:
    """In a worker: model-sized float32 reply tensors copied into the task's reply slots."""
    free = list(slots)
    tensors: dict[str, Any] = {}
    for name, t in reply.tensors.items():
        if free and t.dtype == torch.float32 and t.device.type == "cpu" and t.dim() == 1 \
                and t.numel() == _REPLY_SLOTS[free[0]].numel():
            k = free.pop(0)
            _REPLY_SLOTS[k].copy_(t)
            tensors[name] = _Slot(k)
        else:
            tensors[name] = t
    return Message(tensors, reply.scalars)


def _from_slots(reply: Message, slots: list[torch.Tensor]) -> Message:
    """In the parent: a reply with its slots copied out of shared memory."""
    if not any(isinstance(t, _Slot) for t in reply.tensors.values()):
        return reply
    tensors = {n: slots[t.index].clone() if isinstance(t, _Slot) else t for n, t in reply.tensors.items()}
    return Message(tensors, reply.scalars)


def _client_task(
    client_id: int, message: Message, round: int, has_state: bool, state: Any,
    slots: Sequence[int] = (),
):
    """One client half in a worker: `("ok", (reply, new state))`, `("failure", ClientFailure)`
    or `("fatal", exception)`; model-sized reply tensors travel in the reply `slots`."""
    host = _RUN
    assert host is not None, "worker started without a run"
    if has_state:
        host.hold_only(client_id, state)
    else:
        host.hold_only(client_id)
    try:
        reply = host.update(client_id, _unpack(message), round)
    except FATAL as e:
        return "fatal", e
    except Exception as e:  # noqa: BLE001  (one client's fault is not the run's)
        return "failure", failure(client_id, round, e)
    return "ok", (_to_slots(reply, slots), host.states[client_id])


class ProcessExecutor(SequentialExecutor):
    """`sequential` with the clients of a round spread over `workers` processes."""

    def __init__(self, host: ClientHost, workers: int) -> None:
        super().__init__(host)
        self.workers = workers
        self.pool: Any = None
        self.pending: deque[tuple[int, AsyncResult[Any], tuple[int, ...]]] = deque()
        """`(client_id, AsyncResult, reply slots)` of the tasks submitted and not yet handed to
        the server."""
        self.interrupted = False
        self.shared: SharedDownlink | None = None
        self.reply_slots: list[torch.Tensor] = []
        self.free_slots: deque[int] = deque()

    def _start(self) -> None:
        global _RUN, _SLOTS, _REPLY_SLOTS
        dim = self.host.model.dim
        self.shared = SharedDownlink(dim)
        n = REPLY_SLOTS_PER_TASK * IN_FLIGHT * self.workers
        self.reply_slots = [torch.zeros(dim).share_memory_() for _ in range(n)]
        self.free_slots = deque(range(n))
        _RUN, _SLOTS, _REPLY_SLOTS = self.host, self.shared.slots, self.reply_slots
        threads = max(1, torch.get_num_threads() // self.workers)
        try:
            self.pool = multiprocessing.get_context("fork").Pool(
                self.workers, initializer=_init_worker, initargs=(threads,)
            )
        finally:
            _RUN, _SLOTS, _REPLY_SLOTS = None, [], []

    def run(self, round: int, requests: Sequence[tuple[int, Message]]) -> Iterator[tuple[int, Any]]:
        if len(requests) < 2:
            yield from super().run(round, requests)
            return
        if self.pool is None:
            self._start()
        host = self.host
        pending = self.pending = deque()
        assert self.shared is not None
        queue = iter(self.shared.pack(requests))

        free = self.free_slots

        def submit() -> None:
            for client_id, message in queue:
                has_state = client_id in host.states  # a spilled state is read back here
                slots = tuple(free.popleft() for _ in range(min(REPLY_SLOTS_PER_TASK, len(free))))
                task = (client_id, message, round, has_state, host.states.get(client_id), slots)
                pending.append((client_id, self.pool.apply_async(_client_task, task), slots))
                if len(pending) >= IN_FLIGHT * self.workers:
                    return

        submit()
        while pending:
            client_id, result, slots = pending[0]
            try:
                kind, payload = result.get()
            except KeyboardInterrupt:
                self.interrupted = True
                raise
            pending.popleft()
            if kind == "ok":
                payload = (_from_slots(payload[0], self.reply_slots), payload[1])
            free.extend(slots)
            submit()
            if kind == "fatal":
                raise payload
            if kind == "failure":
                yield client_id, payload
                continue
            reply, state = payload
            host.states.put(client_id, state, round + 1)
            host.keep_buffers(client_id, reply)
            yield client_id, reply

    def close(self) -> None:
        """Shut the workers down. After an early stop (a diverged or failed round) the clients
        still in flight (at most `IN_FLIGHT · N`) are let finish first: `Pool.terminate` with
        tasks outstanding can fail inside the standard library ("Cannot have cache with
        result_handler not alive"). After Ctrl-C the workers are terminated at once."""
        if self.pool is None:
            return
        if self.interrupted:
            self.pool.terminate()
        else:
            for _, result, _ in self.pending:
                result.wait()
            self.pool.close()
        self.pool.join()
        self.pool = None
        self.pending.clear()


__all__ = [
    "AUTO_MIN_RUN_WORK", "AUTO_MIN_WORK", "ProcessExecutor", "auto_workers", "round_cost",
    "usable_cores",
]
