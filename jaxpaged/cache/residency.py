"""How long cached blocks live: lifetime, idle time before eviction, and gaps between reuses (sampled).

The definitions follow vLLM's ``kv_block_*`` histograms, in the pool's clock:

* lifetime: from the block being cached to its eviction;
* idle before evict: from its last reference being dropped to its eviction;
* reuse gap: between consecutive references taken on it (a prefix hit or a
  fork), the first measured from when it was cached.

One cached block in ``round(1 / sample)`` is followed (every k-th, so runs are
reproducible); a followed block is flagged on the block itself, so the pool's
loops pay one attribute test per block and nothing else for the others.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxpaged.cache.blocks import KVBlock


class ResidencyTracker:
    """Collects the three samples (cumulative lists: each reader keeps its own position in them)."""

    def __init__(self, sample: float, clock: Callable[[], float]) -> None:
        """``sample`` in (0, 1]: the fraction of cached blocks followed."""
        if not 0 < sample <= 1:
            raise ValueError(f"kv_cache_metrics_sample must be in (0, 1], got {sample!r}")
        self.every = max(1, round(1 / sample))
        self.clock = clock
        self._count = 0
        self._times: dict[int, list[float]] = {}  # block id -> [cached at, last reference, freed at]
        self.lifetimes: list[float] = []
        self.idle_before_evict: list[float] = []
        self.reuse_gaps: list[float] = []

    def cached(self, block: KVBlock) -> None:
        """``block`` was just published in the prefix cache."""
        self._count += 1
        if self._count % self.every == 0:
            block.sampled = True
            now = self.clock()
            self._times[block.block_id] = [now, now, now]

    def referenced(self, block: KVBlock) -> None:
        """A followed block got one more reference."""
        times = self._times[block.block_id]
        now = self.clock()
        self.reuse_gaps.append(now - times[1])
        times[1] = now

    def freed(self, block: KVBlock) -> None:
        """A followed block's last reference was dropped."""
        self._times[block.block_id][2] = self.clock()

    def evicted(self, block: KVBlock) -> None:
        """A followed block is being evicted (called before its hash is cleared)."""
        cached_at, _, freed_at = self._times.pop(block.block_id)
        now = self.clock()
        self.lifetimes.append(now - cached_at)
        self.idle_before_evict.append(now - freed_at)

    def dropped(self, block: KVBlock) -> None:
        """A followed block lost its hash without an eviction (a cache reset): forget it."""
        self._times.pop(block.block_id, None)

    def samples(self) -> dict[str, list[float]]:
        """Every sample so far, by metric name (lists grow; do not modify them)."""
        return {"lifetime": self.lifetimes, "idle_before_evict": self.idle_before_evict,
                "reuse_gap": self.reuse_gaps}
