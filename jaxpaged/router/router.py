"""The prefix-aware router: replicas' KV events in, a replica per request out."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

from jaxpaged.cache.events import KVEvent
from jaxpaged.router.hasher import RequestHasher
from jaxpaged.router.index import PrefixIndex
from jaxpaged.router.policies import ReplicaLoad, RouteRequest


class Router:
    """Routes requests over replicas with a policy, from an index of their cached blocks.

    The owner feeds it each replica's event batches (``on_events``) and current
    loads (``route``'s ``loads``), adds replicas as they start and removes them
    when they die, which drops their blocks from the index.
    """

    def __init__(self, policy, hasher: RequestHasher) -> None:
        """``policy`` has ``choose(RouteRequest, loads) -> replica``; ``hasher`` matches the replicas' engines."""
        self.policy = policy
        self.hasher = hasher
        self.index = PrefixIndex()

    @property
    def replicas(self) -> list[Hashable]:
        """Live replicas, in the order they were added."""
        return self.index.replicas

    def add_replica(self, replica: Hashable) -> None:
        """A replica started, with an empty prefix cache."""
        self.index.add_replica(replica)

    def remove_replica(self, replica: Hashable) -> None:
        """A replica died or left: it gets no more requests and its blocks leave the index."""
        self.index.remove_replica(replica)

    def on_events(self, replica: Hashable, events: Iterable[KVEvent]) -> None:
        """Applies one event batch of ``replica`` (in the order it published them)."""
        self.index.apply(replica, events)

    def matched_tokens(self, token_ids: Sequence[int], cache_salt: str | None = None) -> dict[Hashable, int]:
        """Tokens of the prompt's longest cached prefix on each replica that holds any."""
        hashes = self.hasher.block_hashes(token_ids, cache_salt)
        block_size = self.hasher.block_size
        return {r: n * block_size for r, n in self.index.match(hashes).items()}

    def route(self, token_ids: Sequence[int], loads: Mapping[Hashable, ReplicaLoad],
              cache_salt: str | None = None) -> Hashable:
        """The replica for a request; ``loads`` has one entry per live replica.

        Raises:
          ValueError: no replica, or ``loads`` names replicas other than the live ones.
        """
        if not self.replicas:
            raise ValueError("no replica to route to")
        if set(loads) != set(self.replicas):
            raise ValueError(f"loads must cover exactly the live replicas {self.replicas!r}, got {list(loads)!r}")
        ordered = {r: loads[r] for r in self.replicas}
        request = RouteRequest(len(token_ids), self.matched_tokens(token_ids, cache_salt))
        return self.policy.choose(request, ordered)
