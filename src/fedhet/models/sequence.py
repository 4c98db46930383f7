"""How a model lists the steps of its forward, so the stacked executor can run it as a program.

A module whose forward is a plain sequence of layers says so with a method
`stacked_layers() -> list[nn.Module | ImageView]`: the layers (or `nn.Sequential`s of them) in
the order the forward applies them, with `ImageView(shape)` where it reshapes each sample to an
image. `fedhet.training.program` reads the list and checks it against the forward before using
it; a module without the method (or an `nn.Sequential`, which is its own list) runs on the
general stacked path.

A module may also say which of the listed parts gives the representation a replacement loss
reads (MOON's projection `z`), with `stacked_tap() -> nn.Module`: the program then returns that
part's output beside the logits (`StackedProgram.forward_tapped`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageView:
    """A reshape of each sample to `shape = (C, H, W)`."""

    shape: tuple[int, int, int]


__all__ = ["ImageView"]
