"""Communication accounting: model transfers and bytes per link kind, per round and in total.

Link kinds follow docs/spec.md: `device-cloud` (star), `device-edge`, `edge-cloud`, and
`device-device` (ring hops). A direction is `up` (towards the cloud) or `down`; device-to-device
hops are `peer`. A "transfer" is one message that carries a model-sized tensor; a message with
scalars only (a sample count) adds bytes but no transfer. Per link kind the metrics carry the
round's figures (`device_edge_transfers`, `device_edge_bytes`) and the running totals
(`cum_device_edge_transfers`, `cum_device_edge_bytes`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from fedhet.algorithms.base import Message

LINKS = ("device-cloud", "device-edge", "edge-cloud", "device-device")
DIRECTIONS = ("up", "down", "peer")


@dataclass
class CommLedger:
    model_numel: int
    round_bytes: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    round_transfers: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    total_bytes: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    total_transfers: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def send(self, link: str, direction: str, message: Message) -> None:
        if link not in LINKS or direction not in DIRECTIONS:
            raise ValueError(f"unknown link {link}/{direction}")
        n = message.nbytes()
        models = sum(t.numel() for t in message.tensors.values()) // max(self.model_numel, 1)
        self.round_bytes[(link, direction)] += n
        self.round_transfers[link] += models
        self.total_bytes[(link, direction)] += n
        self.total_transfers[link] += models

    def close_round(self) -> dict[str, float]:
        """The round's figures as metric columns; resets the per-round counters."""
        up = sum(v for (_, d), v in self.round_bytes.items() if d == "up")
        down = sum(v for (_, d), v in self.round_bytes.items() if d == "down")
        peer = sum(v for (_, d), v in self.round_bytes.items() if d == "peer")
        row: dict[str, float] = {
            "uplink_bytes": up,
            "downlink_bytes": down,
            "peer_bytes": peer,
            "cum_bytes": sum(self.total_bytes.values()),
            "model_transfers": sum(self.round_transfers.values()),
            "cum_model_transfers": sum(self.total_transfers.values()),
        }
        for link in LINKS:
            if self.total_transfers.get(link) or any(k[0] == link for k in self.total_bytes):
                key = link.replace("-", "_")
                row[f"{key}_transfers"] = self.round_transfers.get(link, 0)
                row[f"{key}_bytes"] = sum(v for (lk, _), v in self.round_bytes.items() if lk == link)
                row[f"cum_{key}_transfers"] = self.total_transfers.get(link, 0)
                row[f"cum_{key}_bytes"] = sum(
                    v for (lk, _), v in self.total_bytes.items() if lk == link
                )
        self.round_bytes = defaultdict(int)
        self.round_transfers = defaultdict(int)
        return row

    def state(self) -> dict:
        return {"bytes": dict(self.total_bytes), "transfers": dict(self.total_transfers)}

    def restore(self, state: dict) -> None:
        self.total_bytes = defaultdict(int, state["bytes"])
        self.total_transfers = defaultdict(int, state["transfers"])
