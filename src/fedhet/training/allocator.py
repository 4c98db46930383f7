"""Freed memory kept in the process: glibc's `malloc` set up for a training loop on a CPU.

Every local step frees the previous step's activations and allocates the same sizes again.
glibc serves a request above its *mmap threshold* with fresh pages from the kernel, and hands
the top of its heap back once more than its *trim threshold* lies free there. Both thresholds
move on their own (the mmap threshold starts at 128 KiB and rises towards 32 MiB as large
blocks are freed; the trim threshold follows at twice it), so whether a step's few-MiB
activations come back as new pages depends on the order of the process's earlier allocations.
A new page is zero-filled by the kernel on first touch (a minor page fault per 4 KiB), which
costs as much as the arithmetic of a cheap layer.

Measured (benchmarks/RESULTS.md, "The allocator"): one FedAvg round of FedNNNN's MNIST CNN
(10 clients × 60 steps × B = 50, one core) took ~420,000 minor page faults in fedhet's engine
and anywhere from 19,000 to 295,000 in a bare PyTorch loop, by process; with the thresholds
fixed, a few hundred and ~0. That was the "a process keeps whatever speed it starts with" of
the CNN benchmarks.

`keep_freed_memory()` fixes both thresholds (`mallopt(M_MMAP_THRESHOLD)`,
`mallopt(M_TRIM_THRESHOLD)`), so blocks below `MMAP_THRESHOLD` come from the heap and up to
`TRIM_THRESHOLD` of freed memory stays mapped for the next step. **[choice]** 256 MiB each:
above a stacked cohort's largest stacked activation at the papers' settings, and a bound on
the memory a process keeps beyond what it uses. `assemble_clients` calls it when the clients
train on the CPU; `FEDHET_MALLOC=system` leaves the C library's own behaviour (no call). On a
C library other than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform

from fedhet.errors import FedhetError

MMAP_THRESHOLD = 256 << 20
"""Bytes: blocks this large or larger get their own mapping (glibc's default is dynamic)."""
TRIM_THRESHOLD = 256 << 20
"""Bytes of free memory at the heap's top that stay mapped rather than go back to the kernel."""
FALLBACK_MMAP_THRESHOLD = 32 << 20
"""A glibc older than 2.35 refuses a fixed threshold above 32 MiB: then this one."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_done: bool | None = None


def malloc_setting() -> str:
    """`FEDHET_MALLOC`: `tuned` (the default) or `system`; anything else is an error."""
    value = os.environ.get("FEDHET_MALLOC", "tuned").strip().lower() or "tuned"
    if value not in ("tuned", "system"):
        raise FedhetError(
            f"FEDHET_MALLOC must be 'tuned' or 'system', got {os.environ['FEDHET_MALLOC']!r}; "
            "unset it for fedhet's allocator settings (docs/gpu.md, 'The allocator')"
        )
    return value


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds once per process (module docstring).

    Returns whether they are fixed now: False under `FEDHET_MALLOC=system`, on a C library
    other than glibc, or when glibc refuses both values. A forked child inherits the settings."""
    global _done
    if _done is None:
        _done = _fix_thresholds()
    return _done


def _fix_thresholds() -> bool:
    if malloc_setting() == "system" or platform.system() != "Linux" or \
            platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    mmap_ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) or \
        libc.mallopt(_M_MMAP_THRESHOLD, FALLBACK_MMAP_THRESHOLD)
    return bool(mmap_ok) and bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
