"""KV cache events: what entered and left a manager's prefix cache, for a router to mirror.

As vLLM's KV events: ``BlockStored`` (a run of consecutive blocks of one
sequence just published under their chained hashes), ``BlockRemoved`` (cached
blocks whose hashes were dropped because the block was reused) and
``AllBlocksCleared`` (``reset_prefix_cache``). Replaying them in order gives the
set of hashes the manager has cached (:func:`replay`). The hashes are the
manager's own (``jaxpaged.cache.hashing``), so a request's cache salt is in
them: a router hashing a prompt the same way finds only its tenant's blocks.

The manager records events only while a :class:`KVEventLog` is attached
(``KVCacheManager.enable_events``); without one it does no per-block work for
events. The owner drains the log (``take``) once per step, like vLLM's
``take_events``, and ships the batch wherever it goes.
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICE_TIER = "device"


@dataclass(frozen=True)
class BlockStored:
    """Blocks just published in the prefix cache, consecutive in one sequence.

    ``parent_block_hash`` is the hash of the block before ``block_hashes[0]``
    (None for a sequence's first block); each later hash's parent is the one
    before it. ``token_ids`` are the blocks' tokens back to back, when the log
    was asked for them (else None).
    """

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...] | None
    block_size: int
    tier: str = DEVICE_TIER


@dataclass(frozen=True)
class BlockRemoved:
    """Cached blocks whose hashes left the prefix cache (their blocks were reused)."""

    block_hashes: tuple[bytes, ...]
    tier: str = DEVICE_TIER


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every hash of the tier left the prefix cache (``reset_prefix_cache``)."""

    tier: str = DEVICE_TIER


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventLog:
    """Events recorded since the last :meth:`take`, oldest first."""

    def __init__(self, *, include_token_ids: bool = False) -> None:
        """``include_token_ids``: put the blocks' tokens in ``BlockStored`` events (bigger events)."""
        self.include_token_ids = include_token_ids
        self._events: list[KVEvent] = []
        self._removed: list[bytes] = []  # consecutive removals, merged into one BlockRemoved

    def append(self, event: KVEvent) -> None:
        """Records one event."""
        self._flush_removed()
        self._events.append(event)

    def removed(self, block_id: int, block_hash: bytes, token_ids: tuple[int, ...]) -> None:
        """Eviction hook (the block pool's ``on_evict`` signature): records one removed hash."""
        self._removed.append(block_hash)

    def _flush_removed(self) -> None:
        if self._removed:
            self._events.append(BlockRemoved(tuple(self._removed)))
            self._removed = []

    def take(self) -> list[KVEvent]:
        """The events recorded since the last call, oldest first; the log is empty after."""
        self._flush_removed()
        events, self._events = self._events, []
        return events

    def __len__(self) -> int:
        """Events recorded and not taken yet."""
        return len(self._events) + bool(self._removed)


def replay(events: list[KVEvent], cached: set[bytes] | None = None) -> set[bytes]:
    """Applies ``events`` in order to a set of cached hashes (a new one when None) and returns it."""
    cached = set() if cached is None else cached
    for event in events:
        if isinstance(event, BlockStored):
            cached.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            cached.difference_update(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            cached.clear()
        else:
            raise ValueError(f"not a KV event: {event!r}")
    return cached
