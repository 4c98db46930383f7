"""The rows of one stacked call (`CohortTrainer.sgd_many`): which job each row trains, the
stacked state, and the batch table on the device.

`Rows` holds `w` `(R, d)`, the BatchNorm buffers, the stacked chain (`LocalStep.stack` of the
rows' own chains) with its momentum or Adam state, and each job's mini-batch losses summed on
the device. A job leaves when its schedule ends or it fails: its result `(w_τ, τ, mean loss)`
is read then (one host synchronisation for all the jobs leaving at a step). A job handed in
while the stack runs (`Rows.join`: a ring's next hop) takes a new row at the current step:
its `w0`, zero momentum (a device receives the model, not its predecessor's momentum), its own
chain, and its step count starting at 0.

`BatchTable` is every row's mini-batches as one `(R, steps, b)` index tensor on the device:
column `k` is step `base + k` of the call, so a step reads its batches with one indexing
operation and a joining job's batches are appended to the columns still to come.

`HookGroup` runs the `on_step` hooks of one `StackableHook` class as one `StackedHook` on their
rows; `rows_that_fit` sizes a stack to the memory it may take.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhet.training.flat import FlatModel
from fedhet.training.hooks import StackableHook, StackedHook
from fedhet.training.jobs import SGDJob
from fedhet.training.local import BatchSchedule
from fedhet.training.steps import LocalStep


class BatchTable:
    """The jobs' mini-batches for the rest of the call (module doc); made when every job's
    stream is an unread `BatchSchedule` of one batch size (`of`), else the streams are read
    step by step."""

    def __init__(self, table: torch.Tensor, ends: list[int]) -> None:
        self.table = table
        self.base = 0
        """The step of the table's first column."""
        self.ends = ends
        """The step at which each job (by job index) has taken its `τ` steps."""

    @classmethod
    def of(cls, jobs: list[SGDJob], device: torch.device) -> BatchTable | None:
        streams = [j.batches for j in jobs]
        if not all(isinstance(s, BatchSchedule) and s.position == 0 for s in streams):
            return None
        tables: list[torch.Tensor | None] = []
        for job, stream in zip(jobs, streams, strict=True):
            assert isinstance(stream, BatchSchedule)
            try:
                tables.append(stream.table())
            except Exception as e:  # noqa: BLE001  (a client's batch stream failed)
                job.error = e
                tables.append(None)
        widths = {t.shape[1] for t in tables if t is not None and len(t)}
        if len(widths) > 1:
            return None  # batches of several sizes: grouped step by step
        width = widths.pop() if widths else 1
        steps = [len(t) if t is not None else 0 for t in tables]
        table = torch.zeros(len(jobs), max(steps, default=0), width, dtype=torch.int64, device="cpu")
        for c, t in enumerate(tables):
            if t is not None and len(t):
                table[c, : len(t)] = t
        return cls(table.to(device), steps)

    @property
    def width(self) -> int:
        return self.table.shape[2]

    def batches(self, t: int) -> torch.Tensor:
        """Every row's mini-batch at step `t`, `(R, b)`."""
        return self.table[:, t - self.base]

    def steps_left(self, jobs: list[int], t: int) -> int:
        """Steps from step `t` until the first of `jobs` (job indices) has taken its `τ`."""
        return min(self.ends[c] for c in jobs) - t

    def select(self, keep: list[int]) -> None:
        """Keep the rows `keep` (the clients still stepping), in that order."""
        self.table = self.table.index_select(0, torch.tensor(keep, dtype=torch.int64,
                                                             device=self.table.device))

    def fits(self, job: SGDJob) -> bool:
        """Whether `job`'s batches (an unread `BatchSchedule`) have this table's batch size, or
        the table has no rows left (it takes any size then). Drawing them here is the draw the
        job makes anyway; a stream that raises does not fit (its job fails in a later call)."""
        assert isinstance(job.batches, BatchSchedule)
        try:
            table = job.batches.table()
        except Exception:  # noqa: BLE001
            return False
        return len(self.table) == 0 or len(table) == 0 or table.shape[1] == self.width

    def add(self, jobs: list[SGDJob], t: int) -> None:
        """Append rows for `jobs` (which `fit`), their first batch at step `t`."""
        tables = [j.batches.table() for j in jobs]  # type: ignore[attr-defined]
        rest = self.table[:, t - self.base :]
        widths = [x.shape[1] for x in tables if len(x)]
        width = rest.shape[2] if len(rest) or not widths else widths[0]
        steps = max([rest.shape[1], *(len(x) for x in tables)])
        out = torch.zeros(len(rest) + len(tables), steps, width, dtype=torch.int64,
                          device=self.table.device)
        if len(rest):
            out[: len(rest), : rest.shape[1]] = rest
        for i, x in enumerate(tables):
            if len(x):
                out[len(rest) + i, : len(x)] = x.to(self.table.device)
        self.table, self.base = out, t
        self.ends.extend(t + len(x) for x in tables)


class Rows:
    """The stack of one call (module doc): row `r` trains job `rows[r]`."""

    def __init__(self, jobs: list[SGDJob], model: FlatModel, device: torch.device) -> None:
        self.jobs = jobs
        self.model = model
        self.device = device
        self.rows = list(range(len(jobs)))
        self.w = torch.stack([j.w0.to(device) for j in jobs])
        self.has_bufs = model.buffers.numel() > 0
        self.bufs = self._buffers(jobs)
        self.row_chains = [LocalStep.of(j.cfg, j.transforms) for j in jobs]
        self.chain = LocalStep.stack(self.row_chains, device)
        self.v = self.chain.init(self.w)
        """The chain's state: the momentum buffer, or Adam's `[m | v]` (None without either)."""
        self.loss_sums = torch.zeros(len(jobs), dtype=torch.float64, device=device)
        """Each job's summed mini-batch losses, on the device, read once: when it leaves."""
        self.at = torch.arange(len(jobs), device=device)
        """The job of each row, on the device (`loss_sums`' index)."""
        self.starts = [0] * len(jobs)
        """The step at which each job joined."""
        self.left = 0
        """Jobs that have left the stack so far."""
        self.joined = False
        """Whether a job joined during the call."""

    def _buffers(self, jobs: list[SGDJob]) -> torch.Tensor:
        if not self.has_bufs:
            return torch.zeros(len(jobs), 0, device=self.device)
        model = self.model
        return torch.stack([(j.buffers if j.buffers is not None else model.buffers).to(self.device)
                            for j in jobs])

    def leave(self, keep: list[int], t: int) -> list[SGDJob]:
        """Drop every row not in `keep` after `t` steps of the call; the jobs without an error
        get their results. Returns the jobs that left, in row order."""
        kept = set(keep)
        gone = [(r, c) for r, c in enumerate(self.rows) if r not in kept]
        ok = [(r, c) for r, c in gone if self.jobs[c].error is None]
        sums = self.loss_sums[[c for _, c in ok]].tolist() if ok else []
        for (r, c), total in zip(ok, sums, strict=True):
            steps = t - self.starts[c]
            job = self.jobs[c]
            job.result = (self.w[r].clone(), steps, total / max(steps, 1))
            job.buffers_out = self.bufs[r].clone() if self.has_bufs else None
        self.left += len(gone)
        self.rows = [self.rows[r] for r in keep]
        self.at = torch.tensor(self.rows, dtype=torch.int64, device=self.device)
        if not keep:  # nothing left to step (a job may still join: `join` rebuilds the chain)
            self.w, self.bufs, self.v = self.w[:0], self.bufs[:0], None
            return [self.jobs[c] for _, c in gone]
        ix = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.w, self.bufs = self.w.index_select(0, ix), self.bufs.index_select(0, ix)
        self.v = self.v.index_select(0, ix) if self.v is not None else None
        self.chain = self.chain.select(keep, self.device)
        return [self.jobs[c] for _, c in gone]

    def join(self, new: list[SGDJob], t: int) -> None:
        """Stack `new` (each `joinable`) as rows that start at step `t`: their `w0`, buffers
        and chains, zero momentum, zero losses."""
        first = len(self.jobs)
        self.jobs.extend(new)
        self.row_chains.extend(LocalStep.of(j.cfg, j.transforms) for j in new)
        self.starts.extend([t] * len(new))
        self.w = torch.cat([self.w, torch.stack([j.w0.to(self.device) for j in new])])
        self.bufs = torch.cat([self.bufs, self._buffers(new)])
        self.rows += range(first, first + len(new))
        steps_taken = self.chain.t
        self.chain = LocalStep.stack([self.row_chains[c] for c in self.rows], self.device)
        self.chain.t = steps_taken
        if self.v is None or len(self.w) == len(new):
            self.v = self.chain.init(self.w)
        else:
            self.v = torch.cat([self.v, self.v.new_zeros(len(new), self.v.shape[1])])
        self.loss_sums = torch.cat([self.loss_sums, self.loss_sums.new_zeros(len(new))])
        self.at = torch.tensor(self.rows, dtype=torch.int64, device=self.device)
        self.joined = True

    def add_losses(self, loss: torch.Tensor) -> None:
        """Add each row's mini-batch loss of this step to its job's sum (on the device)."""
        self.loss_sums.index_add_(0, self.at, loss.to(torch.float64))


@dataclass
class HookGroup:
    """The jobs whose `on_step` hooks are of one `StackableHook` class, run as one `StackedHook`."""

    hook: StackedHook
    jobs: list[int]
    """The members' job indices, in stack order."""

    def step(self, t: int, w: torch.Tensor, g: torch.Tensor, rows: list[int], jobs: list[SGDJob]) -> None:
        if not self.jobs:
            return
        if self.jobs == rows:
            wv, gv = w, g
        else:
            where = {c: r for r, c in enumerate(rows)}
            ix = torch.tensor([where[c] for c in self.jobs], device=w.device)
            wv, gv = w.index_select(0, ix), g.index_select(0, ix)
        try:
            self.hook(t, wv, gv)
        except Exception as e:  # noqa: BLE001  (the stacked hook failed: its clients fail)
            for c in self.jobs:
                jobs[c].error = jobs[c].error or e

    def leave(self, gone: list[int], t: int, jobs: list[SGDJob]) -> None:
        if not gone:
            return
        leaving = set(gone)
        members = [k for k, c in enumerate(self.jobs) if c in leaving]
        self.jobs = [c for c in self.jobs if c not in leaving]
        try:
            self.hook.leave(members, t)
        except Exception as e:  # noqa: BLE001
            for c in gone:
                jobs[c].error = jobs[c].error or e


def stack_hooks(jobs: list[SGDJob]) -> list[HookGroup]:
    """One group per `StackableHook` class among the jobs' hooks (others run row by row)."""
    by_class: dict[type[StackableHook], list[int]] = {}
    hooks: dict[int, StackableHook] = {}
    for c, job in enumerate(jobs):
        if isinstance(job.on_step, StackableHook):
            by_class.setdefault(type(job.on_step), []).append(c)
            hooks[c] = job.on_step
    groups = []
    for cls, members in by_class.items():
        try:
            hook = cls.stack([hooks[c] for c in members])
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001  (reported on its clients, as a failing hook)
            for c in members:
                jobs[c].error = e
            continue
        groups.append(HookGroup(hook, members))
    return groups


HOST_STACK_BYTES = 1 << 30
"""**[choice]** On a CPU, the stacked state (`w`, `g`, momentum) kept under ~1 GiB: beyond it
rows run in chunks, one after another (a CPU gains nothing from wider stacks once the rows'
arithmetic dominates, and the machine's memory is shared with everything else)."""
DEVICE_STACK_SHARE = 0.5
"""**[choice]** On a GPU, the stacked state may take half of the device memory free when the
stack is sized; the other half is for the activations and the data. A first step that runs
out of memory anyway halves the stack and retries (`CohortTrainer.sgd_many`)."""


def rows_that_fit(dim: int, device: torch.device | str, vectors: int = 3) -> int:
    """How many rows of a `dim`-parameter model one stack holds: its state of `vectors`
    float32 vectors a row (`w`, `g` and momentum; Adam's two moments instead of momentum:
    4) within `HOST_STACK_BYTES` on a CPU, within `DEVICE_STACK_SHARE` of the free memory on
    a GPU (`torch.cuda.mem_get_info`)."""
    per_row = vectors * 4 * max(dim, 1)
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return max(1, int(free * DEVICE_STACK_SHARE) // per_row)
    return max(1, HOST_STACK_BYTES // per_row)


__all__ = [
    "DEVICE_STACK_SHARE", "HOST_STACK_BYTES", "BatchTable", "HookGroup", "Rows", "rows_that_fit",
    "stack_hooks",
]
