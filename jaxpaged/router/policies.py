"""Routing policies: which replica gets a request, from its prompt's cached prefix and the replicas' load."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaLoad:
    """What a replica reports about its load (from its scheduler and cache manager)."""

    num_waiting: int = 0  # requests queued, not admitted yet
    num_running: int = 0  # requests admitted
    kv_usage: float = 0.0  # fraction of KV blocks held by requests

    @property
    def num_requests(self) -> int:
        """Requests the replica holds, waiting or running."""
        return self.num_waiting + self.num_running


@dataclass(frozen=True)
class RouteRequest:
    """What a policy sees of one request: its length and each replica's cached prefix of it (in tokens)."""

    num_tokens: int
    matched_tokens: Mapping[Hashable, int]  # replicas holding none are absent


class _TieBreaker:
    """Picks the least-loaded replica; equally loaded ones take turns (idle replicas all get requests)."""

    def __init__(self) -> None:
        self._turn = 0

    def least_loaded(self, loads: Mapping[Hashable, ReplicaLoad]) -> Hashable:
        """Fewest requests, then lowest KV usage; among equals, the next one after the last tie's pick."""
        replicas = list(loads)
        start = self._turn % len(replicas)
        rotated = replicas[start:] + replicas[:start]
        self._turn += 1
        return min(rotated, key=lambda r: (loads[r].num_requests, loads[r].kv_usage))


class LeastLoadedPolicy:
    """The replica holding the fewest requests (then the lowest KV usage; equals take turns)."""

    name = "least_loaded"

    def __init__(self) -> None:
        """No state but the tie-break turn."""
        self._ties = _TieBreaker()

    def choose(self, request: RouteRequest, loads: Mapping[Hashable, ReplicaLoad]) -> Hashable:
        """The least-loaded replica of ``loads``."""
        return self._ties.least_loaded(loads)


class RoundRobinPolicy:
    """Each replica in turn, ignoring cache contents and load."""

    name = "round_robin"

    def __init__(self) -> None:
        """Starts at the first replica."""
        self._next = 0

    def choose(self, request: RouteRequest, loads: Mapping[Hashable, ReplicaLoad]) -> Hashable:
        """The next replica of ``loads`` in order."""
        replicas = list(loads)
        replica = replicas[self._next % len(replicas)]
        self._next += 1
        return replica


class PrefixAwarePolicy:
    """The replica with the longest cached prefix of the request, minus a load penalty.

    Score of a replica: ``matched_tokens / num_tokens - waiting_penalty *
    num_waiting - kv_usage_penalty * kv_usage``; the best score wins, ties to the
    less loaded. Falls back to the least-loaded replica when no replica holds
    any block of the prompt, or when loads are imbalanced: the busiest replica
    holds more than ``imbalance_threshold`` requests more than the idlest (Ray
    Serve's PrefixCacheAffinityRouter rules).
    """

    name = "prefix_aware"

    def __init__(self, *, waiting_penalty: float = 0.05, kv_usage_penalty: float = 0.1,
                 imbalance_threshold: int = 16) -> None:
        """Penalties per waiting request and per unit of KV usage; the imbalance (in requests) that overrides."""
        for name, value in (("waiting_penalty", waiting_penalty), ("kv_usage_penalty", kv_usage_penalty),
                            ("imbalance_threshold", imbalance_threshold)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.waiting_penalty = waiting_penalty
        self.kv_usage_penalty = kv_usage_penalty
        self.imbalance_threshold = imbalance_threshold
        self._ties = _TieBreaker()

    def choose(self, request: RouteRequest, loads: Mapping[Hashable, ReplicaLoad]) -> Hashable:
        """See the class docstring."""
        counts = [load.num_requests for load in loads.values()]
        if max(counts) - min(counts) > self.imbalance_threshold:
            return self._ties.least_loaded(loads)
        matched = {r: n for r, n in request.matched_tokens.items() if r in loads and n > 0}
        if not matched:
            return self._ties.least_loaded(loads)

        def score(replica: Hashable) -> tuple[float, int, float]:
            load = loads[replica]
            fraction = matched.get(replica, 0) / max(request.num_tokens, 1)
            penalty = self.waiting_penalty * load.num_waiting + self.kv_usage_penalty * load.kv_usage
            return (fraction - penalty, -load.num_requests, -load.kv_usage)

        return max(loads, key=score)


POLICIES = {"prefix_aware": PrefixAwarePolicy, "round_robin": RoundRobinPolicy, "least_loaded": LeastLoadedPolicy}


def make_policy(name: str, **options):
    """A policy by name (``prefix_aware``, ``round_robin``, ``least_loaded``), with its options."""
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[name](**options)
