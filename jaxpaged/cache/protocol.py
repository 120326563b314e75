"""What the scheduler and engine need from a KV cache manager (paged, or the contiguous baseline)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from jaxpaged.cache.namespaces import Namespace
from jaxpaged.cache.records import BlockTableUpdate, CacheStats, PrefixMatch
from jaxpaged.cache.residency import ResidencyTracker


class KVManager(Protocol):
    """Block tables and their lifecycle, on the host; implemented by `KVCacheManager` (paged, any KV
    cache groups) and `ContiguousKVCacheManager`. The manager never touches device arrays.

    What only some managers can do is declared here too, never probed: `unitary`,
    `eviction_policy`, `residency` and `pin_prefix` say what a manager without
    a prefix cache or without paged tables lacks."""

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool
    unitary: bool  # one full-attention KV cache group in paged tables that grow a block per block_size tokens

    @property
    def eviction_policy(self) -> str:
        """The name of the policy choosing among cached free blocks ("none" without a prefix cache)."""
        ...

    @property
    def residency(self) -> ResidencyTracker | None:
        """The sampled block-residency tracker, or None when not measured (or no prefix cache)."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds."""
        ...

    @property
    def stats(self) -> CacheStats:
        """Occupancy and prefix-cache counters."""
        ...

    def match_prefix(self, token_ids: Sequence[int], *, cache_salt: str | None = None) -> PrefixMatch:
        """The longest cached prefix of `token_ids` (no side effects)."""
        ...

    def allocate_new(self, seq_id: Hashable, token_ids: Sequence[int], num_new_tokens: int,
                     match: PrefixMatch | None, *, cache_salt: str | None = None,
                     count_query: bool = True) -> bool:
        """Admit a sequence with its matched prefix and `num_new_tokens` more slots; False if it does not fit now.

        `count_query=False`: the sequence skipped the lookup; the hit-rate counters leave it out."""
        ...

    def allocate_slots(self, seq_id: Hashable, num_new_tokens: int, *,
                       num_computed_tokens: int) -> BlockTableUpdate | None:
        """Slots for `num_new_tokens` more tokens after the first `num_computed_tokens` (computed or being
        computed: the caller owns that count); None if they do not fit now."""
        ...

    def commit(self, seq_id: Hashable, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """The first `num_computed_tokens` of `token_ids` now have K/V."""
        ...

    def release_slots_after(self, seq_id: Hashable, num_tokens: int) -> int:
        """Free the blocks past the first `num_tokens` slots (rejected draft tokens'); returns how many."""
        ...

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Start `child_id` sharing the parent's computed blocks (every scheduled token committed first)."""
        ...

    def free(self, seq_id: Hashable) -> None:
        """Release every block of the sequence."""
        ...

    def block_table(self, seq_id: Hashable) -> list[int]:
        """A copy of the sequence's physical block ids."""
        ...

    def num_blocks_held(self, seq_id: Hashable) -> int:
        """Blocks the sequence keeps from others."""
        ...

    def held_blocks(self, seq_id: Hashable) -> list[int]:
        """The block ids the sequence holds (a block slid out of a window is not held)."""
        ...

    def pin_prefix(self, token_ids: Sequence[int], ttl_s: float, *, cache_salt: str | None = None) -> int:
        """Keep the prefix's cached blocks for `ttl_s` seconds; the blocks cached now. ValueError without
        a prefix cache."""
        ...

    def reset_prefix_cache(self, namespace: Namespace | None = None) -> bool:
        """Drop every cached block nobody holds; False (nothing done) while any block is in use. With
        ``namespace``: only the free cached blocks whose salt is in it (`jaxpaged.cache.namespaces`), never
        refused."""
        ...

    def check_invariants(self) -> None:
        """Recompute every bookkeeping rule from scratch; AssertionError on the first broken one."""
        ...
