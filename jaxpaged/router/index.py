"""Which replica caches which block: an index block hash -> replicas, fed by the replicas' KV events."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from jaxpaged.cache.events import DEVICE_TIER, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


class PrefixIndex:
    """Block hash -> the replicas that hold it, and each replica's hashes (to drop a replica at once).

    Mirrors one tier of each replica's prefix cache (the device tier unless told
    otherwise) exactly when every event batch a replica published since it
    started is applied in order; other tiers' events are skipped.
    """

    def __init__(self, tier: str = DEVICE_TIER) -> None:
        """An index with no replica, mirroring the replicas' ``tier`` (``"device"``, ``"host"``, ``"disk"``)."""
        self.tier = tier
        self._holders: dict[bytes, set[Hashable]] = {}
        self._blocks: dict[Hashable, set[bytes]] = {}

    @property
    def replicas(self) -> list[Hashable]:
        """The replicas known to the index, in the order they were added."""
        return list(self._blocks)

    def add_replica(self, replica: Hashable) -> None:
        """Starts tracking ``replica`` with an empty cache; a ValueError if it is tracked already."""
        if replica in self._blocks:
            raise ValueError(f"replica {replica!r} is already in the index")
        self._blocks[replica] = set()

    def remove_replica(self, replica: Hashable) -> None:
        """Forgets ``replica`` and every block it held (it died or left); a ValueError if unknown."""
        self._clear(self._replica_blocks(replica), replica)
        del self._blocks[replica]

    def blocks_of(self, replica: Hashable) -> set[bytes]:
        """A copy of the hashes the index believes ``replica`` caches."""
        return set(self._replica_blocks(replica))

    def __len__(self) -> int:
        """Distinct hashes cached by at least one replica."""
        return len(self._holders)

    def apply(self, replica: Hashable, events: Iterable[KVEvent]) -> None:
        """Applies one replica's events, in the order it recorded them."""
        blocks = self._replica_blocks(replica)
        holders = self._holders
        for event in events:
            if event.tier != self.tier:
                continue
            if isinstance(event, BlockStored):
                for block_hash in event.block_hashes:
                    if block_hash not in blocks:
                        blocks.add(block_hash)
                        holders.setdefault(block_hash, set()).add(replica)
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    if block_hash in blocks:
                        blocks.discard(block_hash)
                        self._drop_holder(block_hash, replica)
            elif isinstance(event, AllBlocksCleared):
                self._clear(blocks, replica)
            else:
                raise ValueError(f"not a KV event: {event!r}")

    def match(self, block_hashes: Sequence[bytes]) -> dict[Hashable, int]:
        """For each replica holding ``block_hashes[0]``: how many leading blocks of the chain it holds.

        Replicas holding none are absent. Costs O(matched blocks x holders).
        """
        result: dict[Hashable, int] = {}
        if not block_hashes:
            return result
        alive = set(self._holders.get(block_hashes[0], ()))
        for depth, block_hash in enumerate(block_hashes[1:], start=1):
            if not alive:
                break
            holders = self._holders.get(block_hash, ())
            for replica in [r for r in alive if r not in holders]:
                alive.discard(replica)
                result[replica] = depth
        for replica in alive:
            result[replica] = len(block_hashes)
        return result

    def _replica_blocks(self, replica: Hashable) -> set[bytes]:
        blocks = self._blocks.get(replica)
        if blocks is None:
            raise ValueError(f"replica {replica!r} is not in the index (known: {list(self._blocks)!r})")
        return blocks

    def _drop_holder(self, block_hash: bytes, replica: Hashable) -> None:
        holders = self._holders[block_hash]
        holders.discard(replica)
        if not holders:
            del self._holders[block_hash]

    def _clear(self, blocks: set[bytes], replica: Hashable) -> None:
        for block_hash in blocks:
            self._drop_holder(block_hash, replica)
        blocks.clear()
