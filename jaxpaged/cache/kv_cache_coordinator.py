"""What every KV cache group must agree on: the longest prefix hit, its extension from a lower tier, what fits.

As vLLM v1's ``KVCacheCoordinator``: one :class:`SingleTypeKVCacheManager`
per group, and the cross-group rules on top. A prefix hit of L blocks needs
every group to serve it (full groups all L blocks, each sliding group the
blocks covering the last W - 1 tokens before token ``L * block_size``); the
longest L is found by shrinking it until all agree (full groups are
prefix-closed, sliding ones are not: vLLM's ``find_longest_cache_hit``
fixpoint). A model with one full-attention group (every plain model) takes
the unitary path: the run of leading cached blocks.

Extensions are how blocks computed elsewhere enter a sequence: a lower tier
(host, disk) or a swapped-out copy fills fresh blocks at the ``FROM_TIER``
entries of an extended match, and ``KVCacheManager.allocate_new`` admits
them as computed. No side effects here; the manager applies what is planned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jaxpaged.cache.block_pool import KVBlock
from jaxpaged.cache.kv_groups import KVCacheLayout
from jaxpaged.cache.records import PrefixMatch
from jaxpaged.cache.single_type_managers import SingleTypeKVCacheManager, single_type_manager
from jaxpaged.mathutils import cdiv


class _FromTier:
    """The type of :data:`FROM_TIER`."""

    def __repr__(self) -> str:
        return "FROM_TIER"


FROM_TIER = _FromTier()  # a matched entry a lower tier restores into a fresh block (see plan_extension)


@dataclass
class MatchExtension:
    """A device match extended with blocks from elsewhere (``plan_extension``, ``plan_swap_in``).

    ``group_blocks`` covers ``num_blocks`` positions per group; ``slots`` are the
    ``(index, group)`` entries that are :data:`FROM_TIER`, in flat-table order.
    ``num_tokens`` is the computed length it gives (a swapped-out sequence's
    last block may be partial).
    """

    num_blocks: int
    group_blocks: list[list[KVBlock | None | _FromTier]]
    slots: list[tuple[int, int]]
    num_tokens: int


class KVCacheCoordinator:
    """The single-type managers of a layout's groups, and the rules that span them.

    ``max_chunk_tokens`` bounds the tokens one step computes for a sequence (the
    scheduler's token budget); with it a sliding group's share of a long
    sequence is bounded by ``W + chunk`` tokens when checking what can ever fit.
    """

    def __init__(self, layout: KVCacheLayout, block_size: int, max_chunk_tokens: int | None = None) -> None:
        self.block_size = block_size
        self.max_chunk_tokens = max_chunk_tokens
        self.managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            single_type_manager(group, g, block_size) for g, group in enumerate(layout.groups))
        self.num_groups = len(self.managers)
        self.sliding = tuple(m for m in self.managers if m.drops_blocks)  # groups whose old blocks go
        self.unitary = self.num_groups == 1 and not self.sliding  # one full-attention group: a plain model

    # ----------------------------------------------------------------- capacity

    def max_blocks_for(self, num_tokens: int) -> int:
        """The most blocks (all groups) a sequence of ``num_tokens`` tokens holds at once."""
        if self.unitary:
            return cdiv(num_tokens, self.block_size)
        chunk = self.max_chunk_tokens or num_tokens
        return sum(m.max_blocks(num_tokens, chunk) for m in self.managers)

    # --------------------------------------------------------------- prefix hits

    def find_longest_cache_hit(self, get: Callable[[bytes], KVBlock | None], hashes: Sequence[bytes],
                               max_blocks: int) -> tuple[int, list[list[KVBlock | None]]]:
        """The longest hit (in blocks, at most ``max_blocks``) every group serves, and each group's blocks of it.

        ``get`` looks a key up in the device prefix cache. A group's list holds
        None where it needs no block (before a sliding window).
        """
        if self.unitary:  # the run of leading cached blocks
            hits = self.managers[0].lookup(get, hashes, max_blocks)
            return len(hits), [hits]
        hits = [m.lookup(get, hashes, max_blocks) for m in self.managers]
        length = self.longest_hit(hits, max_blocks)
        return length, self._window_of(hits, length)

    def longest_hit(self, served: Sequence[Sequence[object | None]], max_blocks: int) -> int:
        """Largest L <= ``max_blocks`` that every group can serve (``served[g][j]`` None: missing)."""
        length = max_blocks
        for m in self.managers:
            if m.prefix_closed:
                length = m.longest_hit(served[m.group], length)
        changed = True
        while changed and length > 0:
            changed = False
            for m in self.managers:
                if not m.prefix_closed:
                    hit = m.longest_hit(served[m.group], length)
                    changed |= hit != length
                    length = hit
        return length

    def _window_of(self, entries: Sequence[Sequence], length: int) -> list[list]:
        """Each group's first ``length`` entries, None before what it needs at token ``length * block_size``."""
        out = []
        for m in self.managers:
            first = m.first_needed(length * self.block_size)
            out.append([None if j < first else entries[m.group][j] for j in range(length)])
        return out

    # ---------------------------------------------------------------- extensions

    def plan_extension(self, match: PrefixMatch, get: Callable[[bytes], KVBlock | None],
                       in_lower_tier: Callable[[bytes], bool], max_blocks: int) -> MatchExtension | None:
        """How far a lower tier can extend a device match so that every group is served (no side effects).

        Each group's block at a position past the device hit comes from the
        device prefix cache while it is still there (``get``), else from the
        tier when ``in_lower_tier(key)``. The longest length (at most
        ``max_blocks``) every group can serve is found as for a device hit, and
        a sliding group gets only the blocks of its window before that length's
        first computed token: no restored block is one its layers would not
        hold. None when the tier adds nothing.
        """
        if not match.group_blocks:
            return None
        start, hashes = len(match.group_blocks[0]), match.block_hashes
        max_blocks = min(max_blocks, len(hashes))
        if max_blocks <= start:
            return None
        device = [[get(m.key(h)) for h in hashes[start:max_blocks]] for m in self.managers]
        served = [[True] * start + [True if block is not None or in_lower_tier(m.key(h)) else None
                                    for block, h in zip(device[m.group], hashes[start:max_blocks])]
                  for m in self.managers]
        length = self.longest_hit(served, max_blocks)
        if length <= start:
            return None
        group_blocks, slots = [], []
        for m in self.managers:
            g = m.group
            first = m.first_needed(length * self.block_size)
            entries: list[KVBlock | None | _FromTier] = [None] * min(first, length)
            for j in range(first, length):
                block = match.group_blocks[g][j] if j < start else device[g][j - start]
                entries.append(FROM_TIER if block is None else block)
                if block is None:
                    slots.append((j, g))
            group_blocks.append(entries)
        return MatchExtension(length, group_blocks, sorted(slots), length * self.block_size)

    def plan_swap_in(self, match: PrefixMatch, num_tokens: int,
                     swapped: set[tuple[int, int]]) -> MatchExtension | None:
        """The extension that brings a swapped-out sequence back to ``num_tokens`` computed tokens.

        ``swapped`` holds the ``(index, group)`` blocks the host kept. Each group
        needs what its next query sees (a sliding group its window before
        ``num_tokens``); positions before the device hit come from ``match``,
        later ones from the host. None when something needed is missing (the
        sequence is recomputed) or the device hit already covers it.
        """
        if not match.group_blocks:
            return None
        start, length = len(match.group_blocks[0]), cdiv(num_tokens, self.block_size)
        if num_tokens <= start * self.block_size:
            return None
        group_blocks, slots = [], []
        for m in self.managers:
            g = m.group
            first = m.first_needed(num_tokens)
            entries: list[KVBlock | None | _FromTier] = [None] * min(first, length)
            for j in range(first, length):
                if j < start:
                    entries.append(match.group_blocks[g][j])
                elif (j, g) in swapped:
                    entries.append(FROM_TIER)
                    slots.append((j, g))
                else:
                    return None
            group_blocks.append(entries)
        return MatchExtension(length, group_blocks, sorted(slots), num_tokens)

