"""Streaming aggregation: every aggregate reads its replies once, as they arrive, and gives the
same result as the all-replies-at-once rule (`weighted_sum(sample_weights(...))`)."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.algorithms.base import (
    ALGORITHMS,
    Message,
    Reply,
    RunInfo,
    ServerState,
    WeightedMean,
    sample_weights,
    weighted_sum,
)
from fedhet.training.flat import Layer

D = 12
LAYERS = (
    Layer("fc1.weight", 0, 6, (6,), "fc"), Layer("fc1.bias", 6, 8, (2,), "fc"),
    Layer("conv.weight", 8, 12, (4,), "conv"),
)
RUN = RunInfo(num_clients=9, rounds=3, lr=0.1, momentum=0.0, weight_decay=0.0, seed=0, dim=D, layers=LAYERS)


def random_replies(seed: int, ids, round: int = 0) -> list[Reply]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in ids:
        t = {k: torch.randn(D, generator=g) for k in ("delta", "delta_c", "d", "G", "grad", "w")}
        t["kept"] = torch.tensor([0, 2], dtype=torch.int32)
        s = {
            "num_samples": float(torch.randint(1, 50, (1,), generator=g)),
            "steps": float(torch.randint(2, 9, (1,), generator=g)),
            "train_loss": float(torch.rand(1, generator=g)), "a": float(torch.rand(1, generator=g)) * 5 + 1,
            "lr": 0.1, "kept_steps": 2.0, "herd_dist": 0.5, "loss_sum": 3.0, "hop": 3.0,
            "ring_samples": 30.0,
        }
        if round >= 1:
            s.update(beta=float(torch.rand(1, generator=g)), delta=float(torch.rand(1, generator=g)))
        out.append(Reply(i, Message(t, s)))
    return out


class OnePass:
    """An iterable that may be iterated once only (a second pass is a bug in the aggregate)."""

    def __init__(self, items):
        self.items = list(items)
        self.used = False

    def __iter__(self):
        assert not self.used, "aggregate iterated its replies twice"
        self.used = True
        return iter(self.items)


def build(name: str, **params):
    return ALGORITHMS.get(name).factory(ALGORITHMS.params(name, params), RUN)


# -- the helper ----------------------------------------------------------------------------
@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_weighted_mean_equals_weighted_sum(weighting):
    replies = random_replies(0, range(7))
    acc = WeightedMean(weighting)
    for r in replies:
        acc.add(r, ("delta",), ("train_loss",))
    p = sample_weights(replies, weighting)
    want = weighted_sum(p, [r.message.tensors["delta"] for r in replies])
    assert torch.allclose(acc.mean("delta"), want, atol=1e-6, rtol=0)
    loss = sum(pi * r.message.scalars["train_loss"] for pi, r in zip(p.tolist(), replies, strict=True))
    assert acc.scalar("train_loss") == pytest.approx(loss, rel=1e-12)


def _streamed(replies, weighting="samples", scale=None):
    """The weighted mean summed reply by reply in float64, the rule's plain reading."""
    acc = torch.zeros(D, dtype=torch.float64)
    total = 0.0
    for r in replies:
        w = 1.0 if weighting == "uniform" else r.message.scalars["num_samples"]
        total += w
        acc += w * (scale(r) if scale else 1.0) * r.message.tensors["delta"].double()
    return acc, total


@pytest.mark.parametrize("rows, block_bytes", [(1024, 0), (3, 10**9), (1024, 5 * D * 4), (1024, 10**9)])
def test_blocks_of_any_size_give_the_streamed_sum(monkeypatch, rows, block_bytes):
    """Summed one reply at a time (`block_bytes=0`), in blocks of 3 or of 5 replies, or all in
    one stacked product: the float64 sums agree to float64 rounding, and the mean to float32."""
    monkeypatch.setattr(WeightedMean, "blocks_on_cpu", True)
    monkeypatch.setattr(WeightedMean, "block_rows", rows)
    monkeypatch.setattr(WeightedMean, "block_bytes", block_bytes)
    replies = random_replies(3, range(11))
    scale = lambda r: r.message.scalars["steps"] * 0.5  # noqa: E731
    acc = WeightedMean()
    for r in replies:
        acc.add(r, ("delta",))
    want, total = _streamed(replies)
    assert acc.total == total and acc.count == 11
    assert torch.allclose(acc.sum("delta"), want, rtol=1e-13, atol=1e-13)
    assert torch.allclose(acc.mean("delta"), (want / total).float(), rtol=1e-6, atol=1e-7)
    scaled = WeightedMean("uniform")
    for r in replies:
        scaled.add(r, ("delta",), scale={"delta": scale(r)})
    want, total = _streamed(replies, "uniform", scale)
    assert torch.allclose(scaled.sum("delta"), want, rtol=1e-13, atol=1e-13)


def test_a_block_holds_at_most_its_bytes(monkeypatch):
    """Vectors wait in a block only up to `block_bytes` (bounded memory whatever the clients):
    with room for 4 vectors, a 4th reply sums the block and nothing waits."""
    monkeypatch.setattr(WeightedMean, "blocks_on_cpu", True)
    monkeypatch.setattr(WeightedMean, "block_bytes", 4 * D * 4)
    acc = WeightedMean()
    replies = random_replies(5, range(9))
    waiting = []
    for r in replies:
        acc.add(r, ("delta",))
        waiting.append(len(acc._blocks.get("delta", ([], []))[0]))
    assert waiting == [1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert "delta" in acc and "w" not in acc


# -- each algorithm against the previous all-at-once rule ----------------------------------
def reference(name: str, state: ServerState, replies: list[Reply]) -> dict[str, torch.Tensor]:
    """The rules as they were written over a list of replies (before streaming): the expected
    fields of the new state."""
    p = sample_weights(replies)
    mean = lambda key, q=p: weighted_sum(q, [r.message.tensors[key] for r in replies])  # noqa: E731
    if name in ("fedavg", "fedprox", "grab-fedavg", "moon"):
        return {"w": state.w + mean("delta")}
    if name == "scaffold":
        share = len(replies) / RUN.num_clients
        return {"w": state.w + mean("delta"), "c": state.c + mean("delta_c", p * share)}
    if name == "fednova":
        tau_eff = sum(pi * r.message.scalars["a"] for pi, r in zip(p.tolist(), replies, strict=True))
        return {"w": state.w - replies[0].message.scalars["lr"] * tau_eff * mean("d")}
    if name == "bherd":
        scales = torch.tensor([r.message.scalars["lr"] * r.message.scalars["steps"] for r in replies],
                              dtype=torch.float64)
        return {"w": state.w - mean("G", p * scales)}
    if name == "fedveca":
        taus = torch.tensor([r.message.scalars["steps"] for r in replies], dtype=torch.float64)
        return {"w": state.w - RUN.lr * float(p @ taus) * mean("G"), "grad_last": mean("grad")}
    if name == "hierfavg":
        return {"w": state.w + mean("delta")}
    if name == "fedsr":
        return {"w": mean("w")}
    raise KeyError(name)


NAMES = ["fedavg", "fedprox", "grab-fedavg", "scaffold", "fednova", "bherd", "fedveca", "hierfavg", "fedsr"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_streaming_aggregate_equals_previous_rule(name, seed):
    algo = build(name)
    g = torch.Generator().manual_seed(100 + seed)
    state = algo.init(torch.randn(D, generator=g))
    replies = random_replies(seed, [0, 2, 3, 5, 8])
    want = reference(name, state, replies)
    got, _ = algo.aggregate(state, 0, (r for r in replies))  # a generator, as the runners pass
    for key, value in want.items():
        assert torch.allclose(getattr(got, key), value, atol=1e-6, rtol=1e-6), key


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("fedavg", {}), ("fedavg", {"weighting": "uniform"}), ("fedavg", {"nwda": True}),
        ("fedavgm", {}), ("fedprox", {"nwda": True}), ("scaffold", {"weighting": "uniform"}),
        ("fednova", {"server_momentum": 0.5}), ("fedveca", {}), ("fednnnn", {}),
        ("fednnnn", {"scope": "layer"}), ("norm-norm", {}), ("bherd", {"rescale": False}),
        ("bherd-fednova", {}), ("bherd-scaffold", {}), ("hierfavg", {}), ("fedsr", {}),
    ],
)
def test_every_aggregate_is_single_pass_and_matches_a_list(name, params):
    """Three rounds over a one-shot iterable equal the same rounds over plain lists."""
    runs = []
    for wrap in (list, OnePass):
        algo = build(name, **params)
        g = torch.Generator().manual_seed(7)
        state = algo.init(torch.randn(D, generator=g))
        diags = []
        for k in range(3):
            state, diag = algo.aggregate(state, k, wrap(random_replies(k, [0, 3, 4, 7][: 4 - k], k)))
            diags.append(diag)
        runs.append((state, diags))
    (s1, d1), (s2, d2) = runs
    for key, value in s1.to_record().items():
        if torch.is_tensor(value):
            assert torch.equal(value, getattr(s2, key)), key
    for a, b in zip(d1, d2, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if isinstance(value, float) and not math.isnan(value):
                assert value == b[key], key


def test_hierfavg_edge_aggregate_streams():
    algo = build("hierfavg", clusters=1)
    edge = algo.edge_init(Message({"w": torch.zeros(D)}), 0, [0, 3], 0)
    replies = random_replies(3, [0, 3])
    new = algo.edge_aggregate(edge, 0, (r for r in replies))
    p = sample_weights(replies)
    assert torch.allclose(new["delta"], weighted_sum(p, [r.message.tensors["delta"] for r in replies]))
    assert new["samples"] == sum(r.message.scalars["num_samples"] for r in replies)


def test_an_empty_stream_is_refused():
    algo = build("fedavg")
    with pytest.raises(ValueError, match="at least one reply"):
        algo.aggregate(algo.init(torch.zeros(D)), 0, iter(()))


@pytest.mark.parametrize("block_bytes", [0, 4 * D * 4, 10**9])
def test_nwda_layer_norms_in_blocks_equal_each_reply_alone(monkeypatch, block_bytes):
    """FedNNNN's per-client layer norms `‖Δ_(i,ℓ)‖²` (eq. 5's inputs), stacked in blocks of any
    size, equal the norms of each update taken alone, and the weights follow the replies."""
    from fedhet.algorithms.nwda import LayerIndex, NWDACollector

    monkeypatch.setattr(WeightedMean, "blocks_on_cpu", True)
    monkeypatch.setattr(WeightedMean, "block_bytes", block_bytes)
    index = LayerIndex(LAYERS, D)
    replies = random_replies(11, range(9))
    collect = NWDACollector(index)
    acc = WeightedMean()
    for r in replies:
        collect(r, acc.add(r, ("delta",)))
    stats = collect.stats(acc, acc.mean("delta"))
    by_hand = torch.tensor([[float(r.message.tensors["delta"][layer.start:layer.stop].double().square().sum())
                             for layer in LAYERS] for r in replies], dtype=torch.float64)
    assert stats.client_sq.shape == (9, len(LAYERS))
    assert torch.allclose(stats.client_sq, by_hand, rtol=1e-12, atol=0)
    sizes = torch.tensor([r.message.scalars["num_samples"] for r in replies], dtype=torch.float64)
    assert torch.allclose(stats.p, sizes / sizes.sum(), rtol=1e-15)


def test_on_a_cpu_each_reply_is_summed_as_it_comes():
    """By default a CPU vector never waits (`blocks_on_cpu` off): the sum after each reply is
    `Σ_i w_i v_i` so far, bit for bit the fused float64 accumulation `S ← S + w_i v_i`."""
    replies = random_replies(13, range(6))
    acc = WeightedMean()
    want = torch.zeros(D, dtype=torch.float64)
    for r in replies:
        acc.add(r, ("delta",))
        assert not acc._blocks
        want.add_(r.message.tensors["delta"].double(), alpha=r.message.scalars["num_samples"])
        assert torch.equal(acc._sums["delta"], want)
