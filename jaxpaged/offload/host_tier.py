"""The host (CPU RAM) tier: an LRU cache of KV blocks keyed by block hash, bounded in bytes.

Swapped-out sequences share the byte budget but are pinned (never evicted)
until they are swapped back in or dropped. Each entry keeps its chain's cache
salt, so a tenant's reset drops its entries (:meth:`HostKVCache.drop_namespace`);
restoring needs no salt: the hash already commits to it. While KV events are on
(:meth:`HostKVCache.attach_events`), a new entry is a host ``BlockStored`` and
an evicted one a host ``BlockRemoved``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import numpy as np

from jaxpaged.cache.events import HOST_TIER, AllBlocksCleared, KVEventLog, stored_in_chain_order
from jaxpaged.cache.namespaces import Namespace, salt_in_namespace


class HostBlock:
    """One block's K/V in host memory. ``data`` is None until this step's gather fills it.

    ``parent_hash`` and ``token_ids`` are the block's hash inputs when known
    (an offloaded device block), for the tier's KV events; None otherwise.
    ``cache_salt`` is its chain's salt when known (the namespace a tenant's
    reset matches it by, `jaxpaged.cache.namespaces`).
    """

    __slots__ = ("data", "parent_hash", "token_ids", "cache_salt")

    def __init__(self, data: np.ndarray | None = None, parent_hash: bytes | None = None,
                 token_ids: tuple[int, ...] | None = None, cache_salt: str | None = None) -> None:
        self.data = data
        self.parent_hash = parent_hash
        self.token_ids = token_ids
        self.cache_salt = cache_salt


class HostKVCache:
    """LRU map ``block hash -> HostBlock`` holding at most ``capacity_bytes`` (cached plus pinned)."""

    def __init__(self, capacity_bytes: int, block_bytes: int,
                 on_evict: Callable[[bytes, HostBlock], None] | None = None) -> None:
        if block_bytes <= 0 or capacity_bytes < block_bytes:
            raise ValueError(f"host_cache_bytes={capacity_bytes} is smaller than one KV block "
                             f"({block_bytes} bytes)")
        self.capacity_blocks = capacity_bytes // block_bytes
        self.block_bytes = block_bytes
        self.on_evict = on_evict  # called with each entry pushed out (e.g. to spill it to disk)
        self._lru: collections.OrderedDict[bytes, HostBlock] = collections.OrderedDict()
        self.num_pinned = 0
        self.num_evictions = 0
        self._events: KVEventLog | None = None
        self._block_size = 0  # tokens per block, for events

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._lru

    @property
    def used_bytes(self) -> int:
        """Bytes of cached plus pinned blocks."""
        return (len(self._lru) + self.num_pinned) * self.block_bytes

    def items(self) -> list[tuple[bytes, HostBlock]]:
        """Every entry, least recently used first (a read-only copy, for snapshots)."""
        return list(self._lru.items())

    def get(self, block_hash: bytes) -> HostBlock | None:
        """The block under ``block_hash`` (now most recently used), or None."""
        block = self._lru.get(block_hash)
        if block is not None:
            self._lru.move_to_end(block_hash)
        return block

    def put(self, block_hash: bytes, block: HostBlock) -> None:
        """Insert (or refresh) an entry, evicting least recently used ones beyond capacity."""
        if self._events is not None and block_hash not in self._lru:
            self._events.store(block_hash, block.parent_hash, block.token_ids, self._block_size, HOST_TIER)
        self._lru[block_hash] = block
        self._lru.move_to_end(block_hash)
        self._shrink(self.capacity_blocks - self.num_pinned)

    def attach_events(self, log: KVEventLog | None, block_size: int) -> None:
        """Record this tier's events in ``log`` from now on (None: stop), starting with every entry it holds."""
        self._events, self._block_size = log, block_size
        if log is not None:
            entries = [(h, b.parent_hash, b.token_ids) for h, b in self._lru.items()]
            for event in stored_in_chain_order(entries, block_size, HOST_TIER,
                                               include_token_ids=log.include_token_ids):
                log.append(event)

    def pin(self, num_blocks: int) -> bool:
        """Reserve room for ``num_blocks`` pinned blocks, evicting cached ones; False if they can't fit."""
        if self.num_pinned + num_blocks > self.capacity_blocks:
            return False
        self.num_pinned += num_blocks
        self._shrink(self.capacity_blocks - self.num_pinned)
        return True

    def unpin(self, num_blocks: int) -> None:
        """Give back room reserved by :meth:`pin`."""
        if not 0 <= num_blocks <= self.num_pinned:
            raise ValueError(f"unpin({num_blocks}) with only {self.num_pinned} blocks pinned")
        self.num_pinned -= num_blocks

    def clear_cached(self) -> int:
        """Drop every cached entry (pinned room stays reserved), without spilling them; returns how many."""
        dropped = len(self._lru)
        self._lru.clear()
        if dropped and self._events is not None:
            self._events.append(AllBlocksCleared(HOST_TIER))
        return dropped

    def drop_namespace(self, namespace: Namespace) -> int:
        """Drop the cached entries whose salt is in ``namespace`` (a tenant's reset), without spilling them;
        returns how many."""
        doomed = [h for h, block in self._lru.items() if salt_in_namespace(block.cache_salt, namespace)]
        for block_hash in doomed:
            del self._lru[block_hash]
            if self._events is not None:
                self._events.remove(block_hash, HOST_TIER)
        return len(doomed)

    def _shrink(self, limit: int) -> None:
        while len(self._lru) > limit:
            block_hash, block = self._lru.popitem(last=False)
            self.num_evictions += 1
            if self._events is not None:
                self._events.remove(block_hash, HOST_TIER)
            if self.on_evict is not None:
                self.on_evict(block_hash, block)
