"""KV cache events: what entered and left each KV tier's prefix cache, for a router to mirror.

As vLLM's KV events: ``BlockStored`` (a run of consecutive blocks of one
sequence just published under their chained hashes), ``BlockRemoved`` (cached
blocks whose hashes were dropped) and ``AllBlocksCleared`` (``reset_prefix_cache``,
or a disk tier disabled by a failed write). Every event names its ``tier``, as
vLLM's name a medium: ``"device"`` (the KV cache manager's pool), ``"host"``
and ``"disk"`` (``jaxpaged.offload``). Replaying one tier's events in order
gives the set of hashes that tier holds (:func:`replay`). The hashes are the
manager's own (``jaxpaged.cache.hashing``), so a request's cache salt is in
them: a router hashing a prompt the same way finds only its tenant's blocks.

Tiers are inclusive, and each reports only its own contents: a device block
evicted to the host is a device ``BlockRemoved`` then a host ``BlockStored``;
a host (or disk) block promoted back into the pool is a device ``BlockStored``
(the pool gains it; the host keeps its copy, so no host event); a block the
host pushes out to disk is a host ``BlockRemoved`` and, once written, a disk
``BlockStored``. Swapped-out sequences' blocks are private (not keyed by hash)
and make no event.

The manager records events only while a :class:`KVEventLog` is attached
(``KVCacheManager.enable_events``); without one neither it nor the lower tiers
do any per-block work for events. Enabling starts the log with a
``BlockStored`` for every block each tier already holds (a snapshot restored
before, a router attaching late), parents before children
(:func:`stored_in_chain_order`). The owner drains the log (``take``) once per
step, like vLLM's ``take_events``, and ships the batch wherever it goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

DEVICE_TIER = "device"
HOST_TIER = "host"
DISK_TIER = "disk"


@dataclass(frozen=True)
class BlockStored:
    """Blocks just published in the prefix cache, consecutive in one sequence.

    ``parent_block_hash`` is the hash of the block before ``block_hashes[0]``
    (None for a sequence's first block); each later hash's parent is the one
    before it. ``token_ids`` are the blocks' tokens back to back, when the log
    was asked for them (else None). A lower tier knows less about a block it got
    without its tokens (a disk file left by an earlier process, a host block
    restored from a snapshot): there ``parent_block_hash`` and ``token_ids`` may
    be None even for a later block of a sequence.
    """

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...] | None
    block_size: int
    tier: str = DEVICE_TIER


@dataclass(frozen=True)
class BlockRemoved:
    """Cached blocks whose hashes left the tier (their blocks were reused, evicted or found corrupt)."""

    block_hashes: tuple[bytes, ...]
    tier: str = DEVICE_TIER


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every hash of the tier left it (``reset_prefix_cache``, or the disk tier disabled)."""

    tier: str = DEVICE_TIER


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventLog:
    """Events recorded since the last :meth:`take`, oldest first."""

    def __init__(self, *, include_token_ids: bool = False) -> None:
        """``include_token_ids``: put the blocks' tokens in ``BlockStored`` events (bigger events)."""
        self.include_token_ids = include_token_ids
        self._events: list[KVEvent] = []
        self._removed: list[bytes] = []  # consecutive removals from one tier, merged into one BlockRemoved
        self._removed_tier = DEVICE_TIER

    def append(self, event: KVEvent) -> None:
        """Records one event."""
        self._flush_removed()
        self._events.append(event)

    def removed(self, block_id: int, block_hash: bytes, token_ids: tuple[int, ...],
                parent_hash: bytes | None, cache_salt: str | None) -> None:
        """Device eviction hook (the block pool's ``on_evict`` signature): records one removed hash."""
        self.remove(block_hash, DEVICE_TIER)

    def remove(self, block_hash: bytes, tier: str) -> None:
        """Records that ``tier`` dropped ``block_hash`` (merged with the removals from the same tier just before)."""
        if tier != self._removed_tier:
            self._flush_removed()
            self._removed_tier = tier
        self._removed.append(block_hash)

    def store(self, block_hash: bytes, parent_hash: bytes | None, token_ids: tuple[int, ...] | None,
              block_size: int, tier: str) -> None:
        """Records that ``tier`` stored one block (tokens kept only if the log was asked for them)."""
        self.append(BlockStored((block_hash,), parent_hash, token_ids if self.include_token_ids else None,
                                block_size, tier))

    def _flush_removed(self) -> None:
        if self._removed:
            self._events.append(BlockRemoved(tuple(self._removed), self._removed_tier))
            self._removed = []

    def take(self) -> list[KVEvent]:
        """The events recorded since the last call, oldest first; the log is empty after."""
        self._flush_removed()
        events, self._events = self._events, []
        return events

    def __len__(self) -> int:
        """Events recorded and not taken yet."""
        return len(self._events) + bool(self._removed)


class GroupZeroEventLog(KVEventLog):
    """An event log that keeps only KV cache group 0's keys: the group-tagged keys of groups > 0 make no event.

    Tagged keys (``jaxpaged.cache.kv_groups.group_key``) are longer than a
    plain chained hash; the device eviction hook and the lower tiers (which
    hold every group's blocks) record through here. A model with one group
    needs no filter (a plain :class:`KVEventLog`).
    """

    def __init__(self, digest_len: int, *, include_token_ids: bool) -> None:
        super().__init__(include_token_ids=include_token_ids)
        self._digest_len = digest_len  # a plain chained hash's length; tagged keys are longer

    def append(self, event: KVEvent) -> None:
        """Records ``event`` with the tagged hashes of stored or removed blocks left out (dropped if none are left).

        A tagged key is never a parent (every key's parent is a plain hash), so
        in a stored run it can only come last: the run is cut before it.
        """
        if isinstance(event, BlockRemoved):
            hashes = tuple(h for h in event.block_hashes if len(h) == self._digest_len)
            event = dataclasses.replace(event, block_hashes=hashes)
        elif isinstance(event, BlockStored):
            keep = next((i for i, h in enumerate(event.block_hashes) if len(h) != self._digest_len),
                        len(event.block_hashes))
            tokens = event.token_ids
            event = dataclasses.replace(event, block_hashes=event.block_hashes[:keep],
                                        token_ids=None if tokens is None else tokens[:keep * event.block_size])
        if isinstance(event, (BlockStored, BlockRemoved)) and not event.block_hashes:
            return
        super().append(event)

    def remove(self, block_hash: bytes, tier: str) -> None:
        """Records a removed group-0 hash; other groups' removals make no event."""
        if len(block_hash) == self._digest_len:
            super().remove(block_hash, tier)


CachedEntry = tuple[bytes, bytes | None, tuple[int, ...] | None]  # (hash, parent hash, tokens)


def stored_in_chain_order(entries: Iterable[CachedEntry], block_size: int, tier: str, *,
                          include_token_ids: bool) -> list[BlockStored]:
    """``BlockStored`` events announcing ``entries`` (a tier's cached blocks), each parent before its children.

    A block whose parent is not among ``entries`` (a root, or a parent evicted
    while the child stayed) starts a chain; each chain is walked depth first
    and its straight runs (each block the parent of the next) become one event.
    Blocks with unknown tokens (None) never share a run with blocks with known
    ones, so a run's ``token_ids`` are all its blocks' tokens or None.
    """
    entries = list(entries)
    present = {block_hash for block_hash, _, _ in entries}
    children: dict[bytes, list[CachedEntry]] = {}
    roots: list[CachedEntry] = []
    for entry in entries:
        parent = entry[1]
        if parent is not None and parent in present and parent != entry[0]:
            children.setdefault(parent, []).append(entry)
        else:
            roots.append(entry)
    events = []
    stack = roots[::-1]
    while stack:
        run = [stack.pop()]
        while kids := children.get(run[-1][0]):
            stack.extend(kids[:0:-1])  # siblings after this chain, in their order
            if include_token_ids and (kids[0][2] is None) != (run[-1][2] is None):
                stack.append(kids[0])
                break
            run.append(kids[0])
        tokens = None
        if include_token_ids and run[0][2] is not None:
            tokens = tuple(t for _, _, block_tokens in run for t in block_tokens)
        events.append(BlockStored(tuple(h for h, _, _ in run), run[0][1], tokens, block_size, tier))
    return events


def replay(events: list[KVEvent], cached: set[bytes] | None = None, *, tier: str = DEVICE_TIER) -> set[bytes]:
    """Applies ``tier``'s events, in order, to a set of its cached hashes (a new one when None) and returns it.

    Other tiers' events are skipped.
    """
    cached = set() if cached is None else cached
    for event in events:
        if not isinstance(event, (BlockStored, BlockRemoved, AllBlocksCleared)):
            raise ValueError(f"not a KV event: {event!r}")
        if event.tier != tier:
            continue
        if isinstance(event, BlockStored):
            cached.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            cached.difference_update(event.block_hashes)
        else:
            cached.clear()
    return cached
