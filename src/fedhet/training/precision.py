"""The arithmetic of the local forward and backward passes: `fp32`, `bf16` or `tf32`.

`fp32` is torch's defaults, untouched (bit-identical to a run without this setting). `bf16`
runs the model's forward and loss under `torch.autocast(dtype=torch.bfloat16)`: matrix
products and convolutions take bfloat16 operands and accumulate in float32, while the flat
master weights, the gradient vector they receive, the local step's chain (weight decay,
proximal term, SCAFFOLD's correction, momentum, `w ← w − η d`), aggregation and every
algorithm's server math stay float32 (only the passes are inside the context). `tf32` lets
CUDA matrix products and cuDNN convolutions use TensorFloat-32 (float32 storage, 10-bit
mantissa products); a CPU has no TF32 units, so asking for it there is an error.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch

from fedhet.errors import FedhetError

PRECISIONS = ("fp32", "bf16", "tf32")


@contextlib.contextmanager
def _tf32() -> Iterator[None]:
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def passes(precision: str, device: torch.device | str) -> Callable[[], AbstractContextManager]:
    """A factory of the context the local forward (and loss) run in, for `precision` on
    `device`; raises one `FedhetError` line for an unknown precision or `tf32` off CUDA."""
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise FedhetError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext
    if precision == "tf32":
        if device.type != "cuda":
            raise FedhetError(
                f"precision=tf32 needs a CUDA GPU (TensorFloat-32 units), but this run is on "
                f"{device.type}; use precision=fp32 or bf16 there (--set precision=bf16)"
            )
        return _tf32
    return functools.partial(torch.autocast, device.type, dtype=torch.bfloat16)


__all__ = ["PRECISIONS", "passes"]
