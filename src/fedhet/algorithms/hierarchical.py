"""Hierarchical and decentralised FL (docs/spec.md "Hierarchical and decentralised", seed fedsr.txt).

- `ring` — ring-optimization (FedSR §III-B, eqs. 8–9): the devices form one ring; device 1
  trains from `w_t` for `E` local epochs and passes its model to device 2, …; `w_(t+1)` is the
  last device's model (`z_t^(P_K)`, eq. 9).
- `fedsr` — FedSR (Algorithm 1): `M` edge servers; each round each edge orders its devices into
  a random ring and runs `R` passes around it starting from `w_glob` (eqs. 13–14); the cloud
  sets `w_glob = Σ_m (|D_m|/|D|) w^m` (eq. 15).
- `hierfavg` — HierFAVG (Liu et al., FedSR's baseline): devices run `κ1` local steps, their edge
  averages them (sample-weighted) after each; after `κ2` edge aggregations the cloud averages
  the edges' models (edge-sample-weighted).

Message flow is the engine's (`fedhet.engine.rounds`: topologies `ring`, `edge-ring`,
`edge-star`); this module holds the three roles. The edge role (`EdgeRole`) has the server
half's shape: `edge_init` (from the cloud's downlink), `edge_configure` (downlink to a device),
`edge_aggregate` (device replies → edge state), `edge_report` (uplink to the cloud). For edge
topologies the engine calls the cloud's `configure` once per edge, with the edge's id.

Devices are assigned to edges **[choice]** contiguously and as evenly as possible (device ids
`0..N−1` cut into `M` consecutive blocks, sizes differing by at most one) — the partitions are
already random, so contiguous blocks are random groups; `assignment="random"` deals a
seed-fixed permutation instead, `edge_map="0,1,2,3;4,5,6,7;…"` gives the groups explicitly,
and `cluster_size=Q` regroups the round's sampled devices at random into rings of `Q` each
round (FedSR Table IV: 100 devices, a fraction sampled, 4 per ring). Within an edge the ring is
re-drawn each round from a stream fixed by (seed, round, edge). With client sampling, an edge
works with its sampled members and is skipped when none was sampled.

BatchNorm running statistics (`BUFFERS`) travel and are aggregated with the model they belong
to **[choice]**: along a ring each device starts from its predecessor's statistics and the
edge keeps the last device's, as it keeps the last model (eq. 14); a HierFAVG edge averages its
devices' statistics with the model's weights after each of its `κ2` aggregations and sends the
average down with the edge model; the cloud averages the edges' with the weights of eq. 15.
The result goes back to the engine in the state (`ServerState.buffers`), so the engine does not
average every device update of the round as it does for star topologies.

SGD momentum (0.5 in FedSR §IV) restarts from zero at every hand-off **[choice]**: a device
receives only the model, not its predecessor's momentum buffer. A device visited again in the
same round (a later ring pass or edge iteration) reshuffles its batches from a fresh stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from fedhet.algorithms.base import (
    ALGORITHMS,
    BUFFERS,
    Algorithm,
    ClientContext,
    ClientState,
    Message,
    Reply,
    RunInfo,
    ServerState,
    WeightedMean,
    require_replies,
)
from fedhet.errors import FedhetError
from fedhet.training.local import stream_seed

RING_STREAM = 11
GROUP_STREAM = 13
PASS_STREAM = 100
"""Batch-stream purpose of the `p`-th visit of a device in one round is `100·p` (0 for the first,
the engine's ordinary stream)."""


# -- topology: which devices sit under which edge ------------------------------------------
def parse_edge_map(text: str, num_devices: int) -> list[list[int]]:
    """`"0,1,2;3,4"` → `[[0, 1, 2], [3, 4]]`, checking that every device appears exactly once."""
    groups: list[list[int]] = []
    for m, part in enumerate(text.split(";")):
        try:
            group = [int(v) for v in part.replace(" ", "").split(",") if v != ""]
        except ValueError:
            raise FedhetError(
                f"algorithm.edge_map {text!r} is not a list of device ids like '0,1,2;3,4,5'"
            ) from None
        if not group:
            raise FedhetError(f"algorithm.edge_map gives edge {m} no devices; remove the empty group")
        groups.append(group)
    seen: dict[int, int] = {}
    for m, group in enumerate(groups):
        for d in group:
            if not 0 <= d < num_devices:
                raise FedhetError(
                    f"algorithm.edge_map names device {d}, but devices are 0..{num_devices - 1}"
                )
            if d in seen:
                raise FedhetError(
                    f"algorithm.edge_map names device {d} twice (edges {seen[d]} and {m}); "
                    "give each device exactly one edge"
                )
            seen[d] = m
    missing = sorted(set(range(num_devices)) - set(seen))
    if missing:
        raise FedhetError(
            f"algorithm.edge_map leaves device(s) {missing[:10]} out; give each device exactly one edge"
        )
    return groups


def assign_edges(
    num_devices: int, clusters: int, edge_map: str, assignment: str, seed: int
) -> list[list[int]]:
    """Fixed device → edge groups: from `edge_map`, else `clusters` even blocks (see module doc)."""
    if edge_map:
        return parse_edge_map(edge_map, num_devices)
    if clusters > num_devices:
        raise FedhetError(
            f"algorithm.clusters={clusters} is more than the {num_devices} devices; "
            f"use at most {num_devices} clusters"
        )
    order = np.arange(num_devices)
    if assignment == "random":
        order = stream_seed(seed, -1, -1, GROUP_STREAM).permutation(num_devices)
    return [sorted(int(d) for d in block) for block in np.array_split(order, clusters)]


def ring_order(devices: Sequence[int], seed: int, round: int, edge: int, shuffle: bool) -> list[int]:
    """The ring of one edge in one round: a permutation fixed by (seed, round, edge)."""
    devices = sorted(int(d) for d in devices)
    if not shuffle:
        return devices
    rng = stream_seed(seed, round, edge, RING_STREAM)
    return [devices[i] for i in rng.permutation(len(devices))]


def with_buffers(tensors: dict[str, torch.Tensor], buffers: torch.Tensor | None) -> dict:
    """Message `tensors` plus the BatchNorm statistics under `BUFFERS` when the model has any."""
    return tensors if buffers is None else {**tensors, BUFFERS: buffers}


def mean_buffers(acc: WeightedMean) -> torch.Tensor | None:
    """The `p`-weighted mean of the replies' BatchNorm statistics, None when they carry none."""
    return acc.mean(BUFFERS) if BUFFERS in acc else None


def buffer_names(reply: Reply) -> tuple[str, ...]:
    return (BUFFERS,) if BUFFERS in reply.message.tensors else ()


@dataclass(frozen=True)
class EdgeParams:
    """How devices are grouped under edge servers (shared by FedSR and HierFAVG)."""

    clusters: int = 5
    """`M`, the number of edge servers (ignored when `edge_map` or `cluster_size` is given)."""
    edge_map: str = ""
    """Explicit groups, `"0,1,2,3;4,5,6,7;…"` (edges separated by `;`)."""
    assignment: Literal["contiguous", "random"] = "contiguous"
    cluster_size: int = 0
    """`Q > 0`: each round, split the sampled devices at random into rings of `Q` devices."""
    shuffle: bool = True
    """Re-draw each edge's ring order every round (Algorithm 1); `False` keeps id order."""

    def validate(self) -> None:
        if self.clusters < 1:
            raise FedhetError(f"algorithm.clusters must be ≥ 1, got {self.clusters}")
        if self.cluster_size < 0:
            raise FedhetError(f"algorithm.cluster_size must be ≥ 0, got {self.cluster_size}")


ES = TypeVar("ES", bound=ServerState)
"""A hierarchical algorithm's server (cloud) state."""
EC = TypeVar("EC", bound=ClientState | None)
"""A hierarchical algorithm's device state."""


class EdgeRole(Algorithm[ES, EC]):
    """Grouping of devices and the edge server's half, shared by the hierarchical algorithms.

    The edge state is a dict: `w0` (the model the cloud sent), `w` (the edge model), `extra`
    (other tensors of the cloud's downlink, forwarded unchanged to devices, e.g. BatchNorm
    statistics), `members`, and what the algorithm accumulates.
    """

    def __init__(self, params: Any, run: RunInfo) -> None:
        super().__init__(params, run)
        p = params
        if p.cluster_size > run.num_clients:
            raise FedhetError(
                f"algorithm.cluster_size={p.cluster_size} is more than the {run.num_clients} devices"
            )
        self.edges = assign_edges(run.num_clients, p.clusters, p.edge_map, p.assignment, run.seed)

    def edge_groups(self, clients: Sequence[int], round: int) -> list[tuple[int, list[int]]]:
        """`(edge id, devices in ring order)` for each edge with a sampled device this round."""
        sampled = sorted(int(c) for c in clients)
        if self.params.cluster_size:
            perm = stream_seed(self.run.seed, round, -3, GROUP_STREAM).permutation(sampled)
            q = self.params.cluster_size
            groups = [list(perm[i : i + q]) for i in range(0, len(perm), q)]
        else:
            chosen = set(sampled)
            groups = [[d for d in edge if d in chosen] for edge in self.edges]
        return [
            (m, ring_order(g, self.run.seed, round, m, self.params.shuffle))
            for m, g in enumerate(groups)
            if g
        ]

    def ring_passes(self) -> int:
        return 1

    def edge_iterations(self) -> int:
        return 1

    def edge_init(self, down: Message, edge_id: int, members: Sequence[int], round: int) -> dict:
        w0 = down.tensors["w"]
        extra = {k: v for k, v in down.tensors.items() if k != "w"}
        return {"w0": w0, "w": w0, "extra": extra, "members": list(members), "id": edge_id}

    def edge_configure(self, edge: dict, client_id: int, round: int, iteration: int) -> Message:
        raise NotImplementedError

    def edge_aggregate(self, edge: dict, round: int, replies: Sequence[Reply]) -> dict:
        raise NotImplementedError

    def edge_report(self, edge: dict) -> Message:
        raise NotImplementedError


# -- the ring client (ring-optimization and FedSR) -----------------------------------------
def ring_client_update(message: Message, ctx: ClientContext, visit: int = 0) -> Message:
    """One ring hop (eqs. 8, 13): `E` local epochs of SGD from the received model.

    `visit` is the device's earlier visits this round (its ring pass: batches from a fresh
    stream on each). The message carries `hop` (hops done so far); the reply is the next
    device's downlink. `ring_samples` sums the devices' `D_i` over their first visits, so the
    edge learns `|D_m|` without another message; `loss_sum` sums the hops' training losses.
    """
    hop = int(message.scalars.get("hop", 0))
    w0 = message.tensors["w"]
    batches = ctx.batches(ctx.tau, purpose=PASS_STREAM * visit)
    w, steps, loss = ctx.trainer.sgd(w0, batches, ctx.sgd)
    scalars = {
        "hop": float(hop + 1),
        "ring_samples": message.scalars.get("ring_samples", 0.0) + (ctx.num_samples if visit == 0 else 0),
        "loss_sum": message.scalars.get("loss_sum", 0.0) + loss,
        "num_samples": float(ctx.num_samples),
        "steps": float(steps),
    }
    return Message({"w": w}, scalars)


@dataclass(kw_only=True, eq=False)
class RingVisits(ClientState):
    """A FedSR device's visits in the current round, so that its `p`-th pass draws batches from
    stream `PASS_STREAM · p` and only its first adds `D_i` to `ring_samples`, whichever devices
    of its ring failed before it (counting hops would drift after a failure)."""

    round: int = -1
    """The round of the visits counted."""
    visits: int = 0
    """Visits made in `round`."""


@dataclass(frozen=True, kw_only=True, eq=False)
class RingState(ServerState):
    """Ring-optimization's server state: `w_t` and where it is."""

    holder: int | None = None
    """The device that holds the model `w_t` (the last device of the previous round's ring;
    None before the first round), so the ring runner can tell a hop to itself
    (`engine.rounds.ring_round` reads it with `algorithms.state.ring_holder`)."""


@dataclass(frozen=True)
class RingParams:
    shuffle: bool = True
    """Re-draw the ring order every round; `False` keeps device-id order (Fig. 2's fixed ring)."""


@ALGORITHMS.register("ring", RingParams, "ring-optimization: one ring of all devices (FedSR eqs. 8-9)")
class RingOptimization(EdgeRole[RingState, None]):
    """Ring-optimization (eqs. 8–9). The server state `w` is the last device's model."""

    name = "ring"
    topology = "ring"
    state_class = RingState

    def __init__(self, params: RingParams, run: RunInfo) -> None:
        edge = EdgeParams(clusters=1, shuffle=params.shuffle)
        super().__init__(edge, run)
        self.ring_params = params

    def configure(self, state: RingState, client_id: int, round: int) -> Message:
        return Message({"w": state.w}, {"hop": 0.0})

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        return ring_client_update(message, ctx), state

    def aggregate(self, state: RingState, round: int, replies: Iterable[Reply]):
        (last,) = replies
        s = last.message.scalars
        new = replace(
            state, w=last.message.tensors["w"].clone(), holder=last.client_id,
            buffers=last.message.tensors.get(BUFFERS),
        )
        return new, {
            "local_train_loss": s["loss_sum"] / max(s["hop"], 1.0),
            "ring_hops": s["hop"],
        }


@dataclass(frozen=True)
class FedSRParams(EdgeParams):
    ring_passes: int = 5
    """`R`, passes around each edge's ring per round (Algorithm 1)."""

    def validate(self) -> None:
        super().validate()
        if self.ring_passes < 1:
            raise FedhetError(f"algorithm.ring_passes (R) must be ≥ 1, got {self.ring_passes}")


@ALGORITHMS.register("fedsr", FedSRParams, "FedSR: rings under edge servers, cloud averages edges",
                     example={"algorithm.clusters": 2})
class FedSR(EdgeRole[ServerState, RingVisits]):
    """FedSR (Algorithm 1): `R` ring passes per edge from `w_glob`, then eq. 15 at the cloud."""

    name = "fedsr"
    topology = "edge-ring"
    client_state_class = RingVisits

    def ring_passes(self) -> int:
        return self.params.ring_passes

    def edge_configure(self, edge: dict, client_id: int, round: int, iteration: int) -> Message:
        return Message(
            {"w": edge["w"], **edge["extra"]}, {"hop": 0.0, "ring_samples": 0.0, "loss_sum": 0.0}
        )

    def client_init(self, client_id: int) -> RingVisits:
        return RingVisits()

    def client_update(self, message: Message, ctx: ClientContext, state: RingVisits):
        visit = state.visits if state.round == ctx.round else 0
        return ring_client_update(message, ctx, visit), RingVisits(round=ctx.round, visits=visit + 1)

    def edge_aggregate(self, edge: dict, round: int, replies: Sequence[Reply]) -> dict:
        """`w_(t+1)^m = z_t^(mK)` (eq. 14): the edge model is the ring's last model."""
        (last,) = replies
        s = last.message.scalars
        return {
            **edge, "w": last.message.tensors["w"], "samples": s["ring_samples"],
            "loss": s["loss_sum"] / max(s["hop"], 1.0), "buffers": last.message.tensors.get(BUFFERS),
        }

    def edge_report(self, edge: dict) -> Message:
        return Message(
            with_buffers({"w": edge["w"]}, edge.get("buffers")),
            {"num_samples": edge["samples"], "train_loss": edge["loss"]},
        )

    def aggregate(self, state: ServerState, round: int, replies: Iterable[Reply]):
        """`w_glob = Σ_m (|D_m| / |D|) w^m` over the edges that took part (eq. 15), and the
        edges' BatchNorm statistics with the same weights; one pass."""
        acc = WeightedMean()
        for r in replies:
            acc.add(r, ("w", *buffer_names(r)), ("train_loss",))
        require_replies(acc.count)
        return replace(state, w=acc.mean("w"), buffers=mean_buffers(acc)), {
            "local_train_loss": acc.scalar("train_loss"), "edges": float(acc.count)
        }


@dataclass(frozen=True)
class HierFAVGParams(EdgeParams):
    kappa1: int = 0
    """`κ1` local steps between edge aggregations; 0 = the engine's `τ` (`E` local epochs)."""
    kappa2: int = 5
    """`κ2` edge aggregations per cloud aggregation."""

    def validate(self) -> None:
        super().validate()
        if self.kappa1 < 0:
            raise FedhetError(f"algorithm.kappa1 must be ≥ 0 (0 = local epochs), got {self.kappa1}")
        if self.kappa2 < 1:
            raise FedhetError(f"algorithm.kappa2 must be ≥ 1, got {self.kappa2}")


@ALGORITHMS.register("hierfavg", HierFAVGParams, "HierFAVG: edge averages every κ1 steps, cloud every κ2",
                     example={"algorithm.clusters": 2})
class HierFAVG(EdgeRole[ServerState, None]):
    """HierFAVG: sample-weighted edge averaging after each `κ1` local steps, cloud after `κ2`.

    Edges accumulate their change `Δ^m = w^m − w_glob` and report it; the cloud sets
    `w_glob ← w_glob + Σ_m (|D_m|/|D|) Δ^m`, which equals `Σ_m (|D_m|/|D|) w^m`. With one
    edge and `κ2 = 1` this is FedAvg, message for message.
    """

    name = "hierfavg"
    topology = "edge-star"

    def edge_iterations(self) -> int:
        return self.params.kappa2

    def edge_init(self, down: Message, edge_id: int, members: Sequence[int], round: int) -> dict:
        edge = super().edge_init(down, edge_id, members, round)
        return {**edge, "delta": torch.zeros_like(edge["w0"]), "samples": 0.0, "losses": []}

    def edge_configure(self, edge: dict, client_id: int, round: int, iteration: int) -> Message:
        scalars = {"edge_iter": float(iteration)}
        if self.params.kappa1:
            scalars["tau"] = float(self.params.kappa1)
        return Message({"w": edge["w0"] + edge["delta"], **edge["extra"]}, scalars)

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        w0 = message.tensors["w"]
        tau = int(message.scalars.get("tau", ctx.tau))
        visit = int(message.scalars.get("edge_iter", 0))
        w, steps, loss = ctx.trainer.sgd(w0, ctx.batches(tau, purpose=PASS_STREAM * visit), ctx.sgd)
        reply = Message(
            {"delta": w - w0},
            {"num_samples": float(ctx.num_samples), "steps": float(steps), "train_loss": loss},
        )
        return reply, state

    def edge_aggregate(self, edge: dict, round: int, replies: Iterable[Reply]) -> dict:
        """Edge model `w^m ← w^m + Σ_(i∈m) (D_i/D_m) Δ_i` (sample-weighted FedAvg at the edge),
        over the devices that returned, in one pass."""
        acc = WeightedMean()
        for r in replies:
            acc.add(r, ("delta", *buffer_names(r)), ("train_loss",))
        require_replies(acc.count, "edge_aggregate")
        delta = edge["delta"] + acc.mean("delta")
        loss = acc.scalar("train_loss")
        new = {**edge, "delta": delta, "samples": acc.total, "losses": [*edge["losses"], loss]}
        buffers = mean_buffers(acc)
        if buffers is not None:  # the edge's BatchNorm statistics go down with its model
            new["extra"] = {**edge["extra"], BUFFERS: buffers}
        return new

    def edge_report(self, edge: dict) -> Message:
        loss = float(np.mean(edge["losses"]))
        return Message(
            with_buffers({"delta": edge["delta"]}, edge["extra"].get(BUFFERS)),
            {"num_samples": edge["samples"], "train_loss": loss},
        )

    def aggregate(self, state: ServerState, round: int, replies: Iterable[Reply]):
        """`w_glob ← w_glob + Σ_m (|D_m|/|D|) Δ^m`, and the edges' BatchNorm statistics averaged
        with the same weights."""
        acc = WeightedMean()
        for r in replies:
            acc.add(r, ("delta", *buffer_names(r)), ("train_loss",))
        require_replies(acc.count)
        new = replace(state, w=state.w + acc.mean("delta"), buffers=mean_buffers(acc))
        return new, {
            "local_train_loss": acc.scalar("train_loss"), "edges": float(acc.count)
        }
