"""What moving K/V between a prefill and a decode instance costs: bytes over a link of given bandwidth.

A block moves as its K and V for every layer and KV head
(`Deployment.block_bytes`). An instance of N tensor-parallel devices holds
each block split over its devices by KV head (1/min(N, KV heads) per device,
`ModelConfig.kv_shards`), and each device moves its own share over its own
network interface in parallel (one NIC per GPU, as in DGX H100/H200 nodes), so
a transfer of B bytes takes ``latency_s + B / kv_shards / bandwidth_per_device``.

Each instance sends and receives one transfer at a time, in the order they
were asked for (`LinkSchedule`): a transfer starts when both the sender's
outbound and the receiver's inbound side are free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable


@dataclasses.dataclass(frozen=True)
class KVLink:
    """Bytes/s one device moves in one direction, and a fixed cost per transfer (setup, completion)."""

    bandwidth_per_device: float
    latency_s: float = 0.0

    def __post_init__(self):
        if not self.bandwidth_per_device > 0:
            raise ValueError(f"bandwidth_per_device must be positive, got {self.bandwidth_per_device!r}")
        if not self.latency_s >= 0:
            raise ValueError(f"latency_s must be non-negative, got {self.latency_s!r}")

    def transfer_seconds(self, num_bytes: float, num_shards: int = 1) -> float:
        """Seconds to move `num_bytes` split evenly over `num_shards` devices (0 when nothing moves)."""
        if num_bytes < 0 or num_shards < 1:
            raise ValueError(f"need num_bytes >= 0 and num_shards >= 1, got {num_bytes!r}, {num_shards!r}")
        if num_bytes == 0:
            return 0.0
        return self.latency_s + num_bytes / num_shards / self.bandwidth_per_device


class LinkSchedule:
    """When each instance's outbound and inbound sides are next free; transfers are served in request order."""

    def __init__(self):
        self._out_free: dict[Hashable, float] = {}
        self._in_free: dict[Hashable, float] = {}

    def reserve(self, sender: Hashable, receiver: Hashable, now: float, seconds: float) -> tuple[float, float]:
        """Book a transfer of `seconds` asked for at `now`: its (start, end)."""
        if seconds == 0:
            return now, now
        start = max(now, self._out_free.get(sender, now), self._in_free.get(receiver, now))
        end = start + seconds
        self._out_free[sender] = self._in_free[receiver] = end
        return start, end
