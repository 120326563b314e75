"""Glue between the KV cache manager and the lower tiers: what to offload, what to restore, when.

During ``Scheduler.schedule`` (host only) this records:

* offloads: cached blocks the manager evicts (its ``on_evict`` hook) and the
  blocks of sequences preempted in swap mode. Their device data is intact
  until the next device op, because scheduling never touches the device.
* restores: for an admitted sequence, the blocks right after its device prefix
  hit that the host (or disk) tier holds, or its swapped-out blocks; they go
  into freshly allocated device blocks and are committed as computed.

``apply(runner)`` then runs before the step and before copy-on-write copies:
through the runner (the pool's one owner) it dispatches one gather of every
offloaded block and starts its copy to the host, then one host->device transfer
+ donated scatter of every restored block. The gather is dispatched first, so a
block evicted and reused in the same step is read before it is overwritten;
JAX orders the later donating ops after it.
``finish()`` after the step lands the gathered data (the copy overlapped the
step) and spills host evictions to disk.

An entry is one KV cache group's block, keyed by the group key the device
cache uses (vLLM's offloading ``(block_hash, group)`` keys; a plain model's
one group keys by the plain hash): an evicted block is offloaded under its own
key, and a restore extends the device hit through
``KVCacheManager.plan_extension`` (a swap-in through ``plan_swap_in``) so each
group gets back only the blocks it holds (a sliding group: those of its
window), the rest staying on the device. The extended match goes to
``allocate_new``, the one place blocks computed elsewhere enter a sequence.

KV events: the tiers publish into the manager's event log (``kv.enable_events``)
with ``tier="host"`` / ``"disk"``; see ``jaxpaged.cache.events`` for what each
move between tiers records. A restored block is committed into the device
prefix cache like a computed one, so its promotion is a device ``BlockStored``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import numpy as np

from jaxpaged.cache import KVCacheManager, PrefixMatch
from jaxpaged.cache.hashing import chain_block_hashes, request_extra_keys
from jaxpaged.cache.events import KVEventLog
from jaxpaged.cache.kv_groups import NULL_BLOCK, group_key
from jaxpaged.cache.namespaces import Namespace, salt_in_namespace
from jaxpaged.mathutils import cdiv
from jaxpaged.offload.disk_tier import DiskKVCache, format_tag
from jaxpaged.offload.host_tier import HostBlock, HostKVCache


@dataclasses.dataclass
class Restore:
    """Blocks a sequence gets back from the lower tiers instead of recomputing them.

    ``blocks[i]`` fills flat table index ``indices[i]`` (entry ``j * G + g``:
    group ``g``'s ``j``-th block); ``num_tokens`` is how many tokens past the
    device prefix hit they make computed.
    """

    blocks: list[HostBlock]
    num_tokens: int
    indices: list[int]
    swapped: bool = False


@dataclasses.dataclass
class _SwapRecord:
    blocks: list[HostBlock]
    num_computed: int
    positions: list[tuple[int, int]]  # (index, group) of each block


@dataclasses.dataclass
class TierStats:
    """Cumulative counters of the lower tiers (blocks unless named otherwise)."""

    offloaded: int = 0
    host_hits: int = 0
    disk_hits: int = 0
    swapped_out: int = 0
    swapped_in: int = 0
    swap_fallbacks: int = 0  # swap preemptions that recomputed because the host tier was full
    transfers_out: int = 0  # device->host transfers (one per step with offloads)
    transfers_in: int = 0
    disk_write_errors: int = 0  # failed disk writes (the first one disables the disk tier)


@dataclasses.dataclass
class MissingBlocks:
    """The blocks of a prompt computed elsewhere that an engine lacks, and what landing them takes.

    ``keys``: group keys (``group_key(block hash, group)``) in chain order;
    ``meta``: each key's parent key and block tokens (for the host tier's KV
    events); ``num_held``: the prompt's blocks (per group) already on the
    device or the host, which nobody needs to send.
    """

    keys: list[bytes]
    meta: dict[bytes, tuple[bytes | None, tuple[int, ...]]]
    cache_salt: str | None
    num_held: int


class KVTiers:
    """Host tier (+ optional disk tier) behind a :class:`KVCacheManager`; see the module docstring."""

    def __init__(self, kv: KVCacheManager, host: HostKVCache, disk: DiskKVCache | None = None) -> None:
        self.kv = kv
        self.host = host
        self.disk = disk
        self.block_size = kv.block_size
        self.stats = TierStats()
        self._outgoing: list[tuple[int, HostBlock]] = []  # (device block id, its host copy to fill)
        self._incoming: list[tuple[int, HostBlock]] = []  # (device block id, data to put there)
        self._spilled: list[tuple[bytes, HostBlock]] = []  # host evictions to write to disk
        self._swapped: dict[Hashable, _SwapRecord] = {}
        self._gathering = None  # (host copies to fill, the runner's pending read): offload in flight
        kv.on_evict = self._on_device_evict
        host.on_evict = self._on_host_evict
        kv.add_event_source(self._attach_events)

    def _attach_events(self, log: KVEventLog | None) -> None:
        """The manager enabled (a ``KVEventLog``) or disabled (None) events: pass it to each tier."""
        self.host.attach_events(log, self.block_size)
        if self.disk is not None:
            self.disk.attach_events(log, self.block_size)

    # ---------------------------------------------------------------- offload

    def _on_device_evict(self, block_id: int, block_hash: bytes, token_ids: tuple[int, ...],
                         parent_hash: bytes | None, cache_salt: str | None) -> None:
        copy = HostBlock(None, parent_hash, token_ids, cache_salt)
        self._outgoing.append((block_id, copy))
        self.host.put(block_hash, copy)
        self.stats.offloaded += 1

    def _on_host_evict(self, block_hash: bytes, block: HostBlock) -> None:
        if self.disk is not None:
            self._spilled.append((block_hash, block))

    def swap_out(self, seq_id: Hashable, num_computed: int) -> bool:
        """Keep a preempted sequence's computed blocks on the host; False (nothing kept) if they don't fit.

        Every group's blocks that hold computed tokens and were not dropped (slid out) are kept.
        """
        self.drop_swap(seq_id)
        tables = self.kv.group_block_tables(seq_id)
        positions = [(j, g) for j in range(cdiv(num_computed, self.block_size))
                     for g, table in enumerate(tables) if table[j] != NULL_BLOCK]
        block_ids = [tables[g][j] for j, g in positions]
        if not block_ids or not self.host.pin(len(block_ids)):
            self.stats.swap_fallbacks += bool(block_ids)
            return False
        copies = [HostBlock() for _ in block_ids]
        self._outgoing.extend(zip(block_ids, copies))
        self._swapped[seq_id] = _SwapRecord(copies, num_computed, positions)
        self.stats.swapped_out += len(copies)
        return True

    def drop_swap(self, seq_id: Hashable) -> None:
        """Forget a swapped-out sequence (finished or aborted while waiting)."""
        record = self._swapped.pop(seq_id, None)
        if record is not None:
            self.host.unpin(len(record.blocks))

    @property
    def num_swapped_seqs(self) -> int:
        """Sequences whose blocks are held on the host waiting to be swapped in."""
        return len(self._swapped)

    # ---------------------------------------------------------------- blocks computed elsewhere

    def missing_prompt_blocks(self, tokens: list[int], cache_salt: str | None) -> MissingBlocks:
        """The blocks of ``tokens`` that admission could restore (all but the last token's full blocks, every
        group's) that neither the device prefix cache nor this host tier holds: what a KV connector pulls.
        Hashed as admission hashes them (same salt, same function), so namespaces stay apart."""
        bs = self.block_size
        num_blocks = max(len(tokens) - 1, 0) // bs
        hashes = chain_block_hashes(None, tokens[:num_blocks * bs], bs, request_extra_keys(cache_salt),
                                    self.kv.hash_algo)
        missing = MissingBlocks([], {}, cache_salt, 0)
        for j, block_hash in enumerate(hashes):
            block_tokens = tuple(tokens[j * bs:(j + 1) * bs])
            for g in range(self.kv.num_groups):
                key = group_key(block_hash, g)
                if self.kv.cached_block_id(key) is not None or key in self.host:
                    missing.num_held += 1
                    continue
                missing.keys.append(key)
                missing.meta[key] = (group_key(hashes[j - 1], g) if j else None, block_tokens)
        return missing

    def land(self, missing: MissingBlocks, blocks: list[tuple[bytes, np.ndarray | None]]) -> None:
        """Put ``blocks`` (``(key, data)``, keys of ``missing``) in the host tier: admission restores them
        (``plan_extension`` -> ``allocate_new``) and commits them like blocks computed here."""
        for key, data in blocks:
            parent, tokens = missing.meta.get(key, (None, None))
            self.host.put(key, HostBlock(data, parent, tokens, missing.cache_salt))

    # ---------------------------------------------------------------- restore

    def plan_restore(self, seq_id: Hashable, match: PrefixMatch, num_tokens: int,
                     compute_limit: int) -> Restore | None:
        """What the lower tiers can restore after ``match`` for a sequence being admitted (no commitments).

        At least one token of ``compute_limit`` is always left to compute.
        The plan extends ``match`` in place for ``allocate_new``.
        """
        limit = max(min(num_tokens, compute_limit) - 1, 0) // self.block_size
        record = self._swapped.get(seq_id)
        if record is not None:
            swap_in = self._plan_swap_in(match, record, min(record.num_computed, compute_limit - 1))
            if swap_in is not None:
                return swap_in
        return self._plan_tier_restore(match, limit)

    def _plan_tier_restore(self, match: PrefixMatch, limit: int) -> Restore | None:
        """A restore of every group's blocks the tiers hold after the device hit."""
        missing: set[bytes] = set()  # keys whose disk file turned out unreadable: plan again without them
        while True:
            extension = self.kv.plan_extension(match, lambda key: key not in missing and self._holds(key), limit)
            if extension is None:
                return None
            hashes = match.block_hashes
            blocks = []
            for j, g in extension.slots:
                key = group_key(hashes[j], g)
                block = self._lookup(key, hashes[j - 1] if j else None)
                if block is None:
                    missing.add(key)
                    break
                blocks.append(block)
            else:
                indices = self.kv.apply_extension(match, extension)
                num_tokens = extension.num_blocks * self.block_size - match.num_cached_tokens
                return Restore(blocks, num_tokens, indices)

    def _plan_swap_in(self, match: PrefixMatch, record: _SwapRecord, num_tokens: int) -> Restore | None:
        """The swapped blocks each group needs to get back to ``num_tokens`` computed."""
        kept = dict(zip(record.positions, record.blocks))
        extension = self.kv.plan_swap_in(match, num_tokens, set(kept))
        if extension is None:
            return None
        indices = self.kv.apply_extension(match, extension)
        return Restore([kept[slot] for slot in extension.slots], num_tokens - match.num_cached_tokens,
                       indices, swapped=True)

    def _holds(self, key: bytes) -> bool:
        return key in self.host or (self.disk is not None and key in self.disk)

    def _lookup(self, block_hash: bytes, parent_hash: bytes | None) -> HostBlock | None:
        block = self.host.get(block_hash)
        if block is not None or self.disk is None:
            return block
        data = self.disk.load(block_hash)
        if data is None:
            return None
        block = HostBlock(data, parent_hash, cache_salt=self.disk.salt_of(block_hash))
        self.host.put(block_hash, block)
        self.stats.disk_hits += 1
        return block

    def admitted(self, seq_id: Hashable, restore: Restore | None) -> None:
        """The sequence was admitted: queue its restored blocks (if any) for this step's scatter."""
        self.drop_swap(seq_id)  # whatever was not restored is on the device or will be recomputed
        if restore is None:
            return
        table = self.kv.block_table(seq_id)
        dst = [table[i] for i in restore.indices]
        self._incoming.extend(zip(dst, restore.blocks))
        if restore.swapped:
            self.stats.swapped_in += len(restore.blocks)
        else:
            self.stats.host_hits += len(restore.blocks)

    def drop_namespace(self, namespace: Namespace) -> int:
        """A tenant's reset: drop the host entries and delete the disk files whose chain's salt is in
        ``namespace``; returns how many. Blocks swapped out for a live sequence stay (they are in use)."""
        self._spilled = [(h, b) for h, b in self._spilled if not salt_in_namespace(b.cache_salt, namespace)]
        dropped = self.host.drop_namespace(namespace)
        if self.disk is not None:
            dropped += self.disk.drop_namespace(namespace)
        return dropped

    # ---------------------------------------------------------------- device

    def set_format(self, identity: bytes) -> None:
        """Tie disk files to the pool's dtype, block shape and `identity` (a digest of the engine's model,
        weights, block size, KV dtype, fp8 scales and hash function; call once the scales are final)."""
        if self.disk is not None:
            self.disk.tag = format_tag(self.disk.dtype, self.disk.block_shape, identity)

    def apply(self, runner) -> None:
        """Before the step: dispatch the offload gather, then the restore scatter, on `runner`'s pool.

        `runner` is a `jaxpaged.runner.protocol.BlockMover`. The gather's copy to the
        host overlaps the step; :meth:`finish` lands it.
        """
        if self._outgoing:
            copies = [copy for _, copy in self._outgoing]
            self._gathering = (copies, runner.start_read_blocks([block_id for block_id, _ in self._outgoing]))
            self._outgoing.clear()
            self.stats.transfers_out += 1
        if self._incoming:
            if any(block.data is None for _, block in self._incoming):
                self.finish()  # a block evicted and restored in the same step: land its data first
            runner.write_blocks([block_id for block_id, _ in self._incoming],
                                [block.data for _, block in self._incoming])
            self._incoming.clear()
            self.stats.transfers_in += 1

    def finish(self) -> None:
        """After the step: land the offloaded blocks on the host and spill host evictions to disk."""
        if self._gathering is not None:
            copies, pending = self._gathering
            self._gathering = None
            for copy, data in zip(copies, pending.result()):
                copy.data = data
        for block_hash, block in self._spilled:
            if block.data is not None:
                self.disk.store(block_hash, block.data, block.parent_hash, block.token_ids, block.cache_salt)
        self._spilled.clear()
        if self.disk is not None:
            self.stats.disk_write_errors = self.disk.num_write_errors

    @property
    def idle(self) -> bool:
        """No transfer is queued (true between steps)."""
        return not (self._outgoing or self._incoming or self._spilled or self._gathering)
