"""The sequential executor spread over worker processes (`--workers N`, CPU only).

A round's independent client halves run in `N` forked processes, each holding a copy of the
run (data, model, trainer) made when the pool starts. A task carries what the client half reads
— its id, the downlink message, the round and the client's own state — and brings back the
reply and the client's new state; nothing else crosses. Replies are yielded in request order,
so the server aggregates them in the same order as `--workers 1`, and each client draws from
the same seeded streams (`stream_seed`) in whichever process it runs: the run is bit-identical
to one worker when every process computes with the same number of threads (run with
`OMP_NUM_THREADS=1`, as `make test` does; the workers use `max(1, threads // N)` each).

At most `8 N` tasks are in flight (`IN_FLIGHT`), so the replies waiting for the server are bounded as in the
streaming round runners. A client that raises comes back as a `ClientFailure` (the round goes
on without it); `Diverged`, `FedhetError` and interrupts end the run as in one process. The
pool is forked on first use (`fork`: the copy of the run costs nothing up front) and closed
when the run ends. FedSR's rings reach the workers hop by hop, hop `h` of every edge's ring
together; the single ring of `ring` (one client per call) stays in the main process.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from fedhet.engine.executors import FATAL, SequentialExecutor, failure

if TYPE_CHECKING:
    from fedhet.algorithms.base import Message
    from fedhet.engine.clients import ClientWork

IN_FLIGHT = 8
"""Clients in flight per worker: enough that one large client at the head of the queue does not
leave the other workers idle, few enough that waiting replies stay a bounded multiple of one."""

_RUN: ClientWork | None = None
"""The run a forked worker computes with (set in the parent just before the fork)."""


def _init_worker(threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    torch.set_num_threads(threads)


def _client_task(client_id: int, message: Message, round: int, has_state: bool, state: Any):
    """One client half in a worker: `("ok", (reply, new state))`, `("failure", ClientFailure)`
    or `("fatal", exception)`."""
    work = _RUN
    assert work is not None, "worker started without a run"
    if has_state:
        work.hold_only(client_id, state)
    else:
        work.hold_only(client_id)
    try:
        reply = work.update(client_id, message, round)
    except FATAL as e:
        return "fatal", e
    except Exception as e:  # noqa: BLE001  (one client's fault is not the run's)
        return "failure", failure(client_id, round, e)
    return "ok", (reply, work.states[client_id])


class ProcessExecutor(SequentialExecutor):
    """`sequential` with the clients of a round spread over `workers` processes."""

    def __init__(self, work: ClientWork, workers: int) -> None:
        super().__init__(work)
        self.workers = workers
        self.pool: Any = None
        self.pending: deque[tuple[int, Any]] = deque()
        """`(client_id, AsyncResult)` of the tasks submitted and not yet handed to the server."""
        self.interrupted = False

    def _start(self) -> None:
        global _RUN
        _RUN = self.work
        threads = max(1, torch.get_num_threads() // self.workers)
        try:
            self.pool = multiprocessing.get_context("fork").Pool(
                self.workers, initializer=_init_worker, initargs=(threads,)
            )
        finally:
            _RUN = None

    def run(self, round: int, requests: Sequence[tuple[int, Message]]) -> Iterator[tuple[int, Any]]:
        if len(requests) < 2:
            yield from super().run(round, requests)
            return
        if self.pool is None:
            self._start()
        work = self.work
        pending = self.pending = deque()
        queue = iter(requests)

        def submit() -> None:
            for client_id, message in queue:
                has_state = client_id in work.states
                task = (client_id, message, round, has_state, work.states.get(client_id))
                pending.append((client_id, self.pool.apply_async(_client_task, task)))
                if len(pending) >= IN_FLIGHT * self.workers:
                    return

        submit()
        while pending:
            client_id, result = pending[0]
            try:
                kind, payload = result.get()
            except KeyboardInterrupt:
                self.interrupted = True
                raise
            pending.popleft()
            submit()
            if kind == "fatal":
                raise payload
            if kind == "failure":
                yield client_id, payload
                continue
            reply, state = payload
            work.states[client_id] = state
            work.keep_buffers(client_id, reply)
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
            for _, result in self.pending:
                result.wait()
            self.pool.close()
        self.pool.join()
        self.pool = None
        self.pending.clear()


__all__ = ["ProcessExecutor"]
