"""Probe of BHerd-SCAFFOLD's collapse (docs/bherd.md "BHerd-SCAFFOLD on the digits MLP").

Runs one BHerd-family run in-process (default: docs/bherd.md's digits setting, MLP, half-IID, 5
clients, B = 16, E = 2, 10 rounds, seed 0) and records, per round and client, what the herd
saw: `τ_i`, `m_i`, `‖μ_i‖` (the mean of the gradients the client herded, SCAFFOLD-corrected for
`bherd-scaffold`), `‖G_i − μ_i‖` (the herd's error), mean and max `‖z^λ‖ = ‖g^λ − μ_i‖` (the
spread of the mini-batch gradients), `‖c − c_i‖` (the correction), and per round `‖c‖` and the
test accuracy. Prints a markdown table: all clients' worst ratio `‖G_i − μ_i‖ / ‖μ_i‖` and one
client in detail.

    python benchmarks/bherd_scaffold_probe.py --algorithm bherd-scaffold \\
        --set algorithm.max_herd_error=0 [--client 4]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

import torch

from fedhet.algorithms import bherd
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.training.steps import Correction

DIGITS_MLP = {"dataset": "digits", "model": "mlp", "partition": "half-iid", "clients": 5, "rounds": 10,
              "seed": 0, "batch_size": 16, "local_epochs": 2}


def probe(settings: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[int, list[dict]], dict]:
    """Run `settings`; returns the metric rows, per-round client records and the summary."""
    records: dict[int, list[dict[str, Any]]] = defaultdict(list)
    original = bherd.herd_local_pass

    def recording(w0, ctx, batches, alpha, transforms=(), **kw):
        shift = [float(t.shift.norm()) for t in transforms if isinstance(t, Correction)]
        hp = original(w0, ctx, batches, alpha, transforms=transforms, **kw)
        sel = hp.selection
        records[ctx.round].append({
            "client": ctx.client_id, "tau": hp.steps, "m": len(sel.kept),
            "mu": float(sel.mean_all.norm()), "err": sel.distance, "fallback": sel.fallback,
            "shift": shift[0] if shift else 0.0, **SPREAD,
        })
        return hp

    bherd.herd_local_pass = recording
    try:
        rows: list[dict[str, Any]] = []
        cfg = config_of(settings)
        sim = assemble(cfg, store=None, log=lambda m: None, callbacks=[rows.append])
        summary = sim.run()
    finally:
        bherd.herd_local_pass = original
    return rows, records, summary


SPREAD: dict[str, float] = {}
"""Mean and max `‖g^λ − μ‖` of the buffer herded last (`install_spread_hook`)."""


def install_spread_hook() -> None:
    """Record mean and max `‖g^λ − μ‖` of each herded buffer (wraps `herd_select`, which
    `herd_local_pass` calls once per client update, before the record is made)."""
    original = bherd.herd_select

    def select(x: torch.Tensor, alpha: float):
        sel = original(x, alpha)
        z = torch.linalg.vector_norm(x.double() - sel.mean_all, dim=1)
        SPREAD.update(z_mean=float(z.mean()), z_max=float(z.max()))
        return sel

    bherd.herd_select = select


def table(rows, records, client: int) -> str:
    head = ["round", "test acc", "‖c‖", "max_i ‖G_i − μ_i‖/‖μ_i‖", "fallbacks",
            f"‖c − c_{client + 1}‖", f"‖μ_{client + 1}‖", f"‖G_{client + 1} − μ_{client + 1}‖",
            f"mean ‖z‖ ({client + 1})", f"max ‖z‖ ({client + 1})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        k = int(row["round"])
        recs = records.get(k - 1, [])
        if not recs:
            continue
        mine = next(r for r in recs if r["client"] == client)
        worst = max(r["err"] / max(r["mu"], 1e-12) for r in recs)
        cells = [k, f"{row['test_accuracy']:.3f}", f"{row.get('c_norm', float('nan')):.3f}",
                 f"{worst:.2f}", sum(r["fallback"] for r in recs), f"{mine['shift']:.2f}",
                 f"{mine['mu']:.3f}", f"{mine['err']:.3f}", f"{mine['z_mean']:.2f}",
                 f"{mine['z_max']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default="bherd-scaffold")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--client", type=int, default=4, help="the client shown in detail (0-based)")
    args = ap.parse_args()
    settings = {**DIGITS_MLP, "algorithm": args.algorithm}
    for item in args.set:
        key, _, value = item.partition("=")
        settings[key] = value
    install_spread_hook()
    rows, records, summary = probe(settings)
    print(f"{args.algorithm} {' '.join(args.set)}: final accuracy {summary['final_accuracy']:.4f}")
    print(table(rows, records, args.client), end="")


if __name__ == "__main__":
    main()
