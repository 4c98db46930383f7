"""The papers' partitions against their words: what each paper says, what fedhet does at each
choice the text leaves open, and what the split looks like (docs/paper-scale.md, "Partitions").

A paper declares its `PartitionReading`s in its own folder (`<paper>/partitions.py`): the
paper's words, the run settings fedhet uses for them, and the choices those settings make. The
drawing needs the dataset, which the repository does not hold, so it is made once and committed:

    PYTHONPATH=src python -m fedhet.papers.partition_readings --data-dir data

writes `results/partitions/<key>.json` (the client × label counts of seed 0, with the command,
commit and machine) and `docs/figures/partitions/<key>.png` (the client × label matrix and the
clients' sizes); the page reads the JSON files only (`partition_rows`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.errors import FedhetError

COMMAND = "PYTHONPATH=src python -m fedhet.papers.partition_readings --data-dir data"
FIGURES = Path("docs/figures/partitions")
"""Where the drawings go (from the repository root; the page links them from docs/)."""


@dataclass(frozen=True)
class PartitionReading:
    """One partition of a paper, read (module doc)."""

    key: str
    """File stem of its drawing and counts (`fednnnn-noniid-ub`)."""
    title: str
    quote: str
    """The paper's words about it."""
    source: str
    settings: dict[str, Any]
    """The run settings fedhet uses (dataset, clients, partition, seed)."""
    choices: tuple[str, ...] = field(default_factory=tuple)
    """What fedhet does where the words leave a choice open."""
    cell: tuple[str, str] = ("", "")
    """`(campaign table, group)` of an alternative reading's cells (`Table.alternatives`);
    empty for the reading the paper's tables run."""


def readings() -> list[PartitionReading]:
    """Every paper's declared readings (`READINGS` of its `partitions` module, where it has
    one), in the papers' order: a paper declares its own, and no paper is named here."""
    # lazy: the paper packages import their presets
    from fedhet.papers import PAPERS

    out: list[PartitionReading] = []
    for paper in PAPERS:
        name = f"fedhet.papers.{paper}.partitions"
        if importlib.util.find_spec(name) is not None:
            out += importlib.import_module(name).READINGS
    return out


def counts_of(settings: dict[str, Any], data_dir: str | None = None) -> np.ndarray:
    """`counts[client, label]` of the split a run with `settings` trains on."""
    # lazy: the engine (torch) loads only when a partition is drawn
    from fedhet.data import label_counts
    from fedhet.engine import federate
    from fedhet.reports import data_config

    values = {**settings, **({"data_dir": data_dir} if data_dir else {})}
    fed = federate(data_config(values))
    return label_counts(fed.data.split_labels, fed.parts, fed.data.split_classes)


@dataclass(frozen=True)
class Shape:
    """What a client × label matrix says about its split."""

    clients: int
    sizes: tuple[int, int, int]
    """Smallest, median and largest client."""
    top_share: float
    """Share of the samples held by the largest tenth of the clients (at least one client)."""
    labels: tuple[int, float, int]
    """Labels held per client: fewest, mean, most."""
    held: dict[int, int]
    """`{labels held: clients}`."""


def shape(counts: np.ndarray) -> Shape:
    sizes = counts.sum(axis=1)
    held = (counts > 0).sum(axis=1)
    top = max(1, len(sizes) // 10)
    share = float(np.sort(sizes)[::-1][:top].sum() / max(1, sizes.sum()))
    values, times = np.unique(held, return_counts=True)
    return Shape(len(sizes), (int(sizes.min()), int(np.median(sizes)), int(sizes.max())), share,
                 (int(held.min()), float(held.mean()), int(held.max())),
                 {int(v): int(t) for v, t in zip(values, times, strict=True)})


def describe(s: Shape) -> str:
    """One cell of the page: sizes, the largest tenth's share, labels per client."""
    held = ", ".join(f"{t} with {v}" for v, t in sorted(s.held.items()))
    return (f"{s.clients} clients; sizes {s.sizes[0]:,} / {s.sizes[1]:,} / {s.sizes[2]:,} (min / "
            f"median / max), the largest {max(1, s.clients // 10)} hold {s.top_share:.0%}; labels "
            f"per client {s.labels[0]}–{s.labels[2]} (mean {s.labels[1]:.2f}: {held})")


def draw(counts: np.ndarray, path: Path, title: str) -> None:
    """Two panels: clients × labels (colour = samples, as FedSR Fig. 8) and the clients' sizes."""
    # slow import (matplotlib): only when drawing
    import matplotlib

    matplotlib.use("Agg")
    # slow import (matplotlib): only when drawing
    from matplotlib import pyplot as plt

    fig, (heat, bars) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 2]})
    image = heat.imshow(counts.T, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=heat, label="samples")
    heat.set_xlabel("client")
    heat.set_ylabel("label")
    sizes = np.sort(counts.sum(axis=1))[::-1]
    bars.bar(np.arange(len(sizes)), sizes, width=1.0)
    bars.set_xlabel("client, largest first")
    bars.set_ylabel("training samples")
    bars.set_yscale("log" if sizes.max() > 20 * max(1, sizes.min()) else "linear")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def record(reading: PartitionReading, counts: np.ndarray, out: Path, commit: str) -> Path:
    path = out / f"{reading.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "key": reading.key, "settings": reading.settings, "counts": counts.tolist(),
        "command": COMMAND, "commit": commit,
        "machine": f"{platform.machine()} {platform.system()}, numpy {np.__version__}",
    }) + "\n")
    return path


def read(results: Path, key: str) -> dict[str, Any] | None:
    """A committed drawing's record, or None when it has not been made."""
    path = Path(results) / "partitions" / f"{key}.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        np.asarray(data["counts"], dtype=np.int64)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FedhetError(f"{path} is not a partition record ({e}); make it again: `{COMMAND}`") from None
    return data


def page_lines(results: Path, cell: Callable[[PartitionReading], str] = lambda r: "") -> list[str]:
    """The page's section: per paper partition its words, fedhet's choices, and what the
    committed drawing (`read`) shows; a partition not drawn yet names the command. `cell(r)`:
    what the campaign has of an alternative reading's cells (recorded values, or runs left)."""
    lines = [
        "## Partitions against the papers' words",
        "",
        "Each partition of FedNNNN Table 2 and FedSR Table II (MNIST) as the paper words it, what "
        "fedhet does where the words leave a choice (declared in `src/fedhet/papers/<paper>/"
        "partitions.py`), and the split of seed 0: client sizes, the share of the largest tenth of "
        "the clients, and labels per client (a label counts when a client holds one sample of it). "
        "Where the words allow another split, it is drawn too and its cells (seed 0, the baseline "
        "and the paper's method) run in the campaign after every cell at the paper's seed count. "
        f"Drawn by `{COMMAND}` (the client × label matrix and the sizes, `{FIGURES}/`).",
        "",
        "| partition | the paper's words | fedhet's choices | the split (seed 0) | drawing |",
        "|---|---|---|---|---|",
    ]
    made: set[tuple[str, str]] = set()
    for r in readings():
        data = read(results, r.key)
        if data is None:
            split, picture = f"not drawn yet: `{COMMAND}`", "—"
        else:
            split = describe(shape(np.asarray(data["counts"], dtype=np.int64)))
            picture = f"[{r.key}.png](figures/partitions/{r.key}.png)"
            made.add((str(data.get("commit", "?")), str(data.get("machine", "?"))))
        if r.cell[0]:
            split += f". Campaign cell `{r.cell[1]}`: {cell(r)}"
        cells = [r.title, f"{r.quote} ({r.source})", "; ".join(r.choices), split, picture]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if made:
        lines += ["", "Drawn at " + "; ".join(f"{c} on {m}" for c, m in sorted(made)) + "."]
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="draw the papers' partitions (docs/paper-scale.md)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--results", default="results")
    ap.add_argument("--figures", default=str(FIGURES))
    a = ap.parse_args(argv)
    # lazy: the commit is read only when drawing
    from fedhet.runs import git_commit

    commit = git_commit()
    for r in readings():
        counts = counts_of(r.settings, a.data_dir)
        record(r, counts, Path(a.results) / "partitions", commit)
        draw(counts, Path(a.figures) / f"{r.key}.png", f"{r.title} (seed {r.settings.get('seed', 0)})")
        print(f"{r.key}: {describe(shape(counts))}")


if __name__ == "__main__":
    main()
