"""What outside code asks an engine: its load, cache contents and events, counters, and the prefix-cache reset.

Metrics, the replica pool, the simulator and benchmarks ask these questions
rather than reaching into the scheduler, the KV manager, the runner or the
tiers, so those parts can change shape without their callers changing.
`Engine` mixes this in; every method reads the parts on the caller's thread
(the engine loop's thread in a server).
"""

from __future__ import annotations

from jaxpaged.cache import CacheStats, KVEvent
from jaxpaged.cache.records import CachedBlockInfo
from jaxpaged.offload.tiers import MissingBlocks, TierStats
from jaxpaged.router.policies import ReplicaLoad
from jaxpaged.sequence import SeqStatus


class EngineQueries:
    """Public read-side questions (and the cache reset) answered from the engine's parts."""

    def load(self) -> ReplicaLoad:
        """Requests waiting (those whose KV blocks are still being pulled included) and running, and the
        fraction of KV blocks held by requests."""
        loading = self.kv_connector.num_loading if self.kv_connector is not None else 0
        return ReplicaLoad(num_waiting=len(self.scheduler.waiting) + loading, num_running=len(self.scheduler.running),
                           kv_usage=self.kv.stats.usage)

    def tenant_requests(self, tenant: str | None) -> tuple[int, int]:
        """The tenant's unfinished requests, and how many of them wait (no sequence running); O(the tenant's
        requests), whatever the other tenants have queued."""
        unfinished = waiting = 0
        for request in self._requests_by_tenant.get(tenant, {}).values():
            if request.seqs:
                unfinished += 1
                waiting += all(seq.status is SeqStatus.WAITING for seq in request.seqs)
        return unfinished, waiting

    @property
    def num_preemptions(self) -> int:
        """Sequences preempted so far (recomputed or swapped out)."""
        return self.scheduler.num_preemptions

    def kv_stats(self) -> CacheStats:
        """The device KV cache's counters now: usage, prefix queries/hits, evictions, pinned blocks."""
        return self.kv.stats

    def tier_stats(self) -> TierStats | None:
        """The host/disk tiers' counters; None without a host tier."""
        return None if self.tiers is None else self.tiers.stats

    @property
    def eviction_policy(self) -> str:
        """The device cache's eviction policy name ("none" for the contiguous baseline)."""
        return self.kv.eviction_policy

    def kv_residency_samples(self) -> dict[str, list[float]] | None:
        """Sampled block lifetimes / idle-before-evict / reuse gaps (seconds), or None when not measured
        (`kv_cache_metrics_sample` 0)."""
        tracker = self.kv.residency
        return None if tracker is None else tracker.samples()

    def step_phase_seconds(self) -> dict[str, float]:
        """Host seconds spent so far in each part of `step()`: `schedule`, `update` (applying a step's
        results) and `outputs` (building the request outputs); `jaxpaged.engine.phases`."""
        return self._phases.seconds()

    def device_wait_s(self) -> float:
        """Host seconds spent waiting for the device, for runners that count it (the sleeping simulated
        device, `jaxpaged.sim.sleeping_runner`, behind `serve --device=simulated`); 0.0 for the others."""
        return self.runner.wait_s if self.runner.capabilities.counts_device_time else 0.0

    def kv_slot_usage(self) -> tuple[int, int]:
        """``(filled, reserved)`` KV slots now, across the pool (the PagedAttention paper's waste).

        ``reserved`` is every slot of every block held by a sequence (for the
        contiguous baseline: whole reservations). ``filled`` counts slots holding a
        computed token, each physical block once however many sequences share it.
        Waste is ``1 - filled / reserved``.
        """
        kv = self.kv
        bs = kv.block_size
        filled: dict[int, int] = {}
        for seq in self.scheduler.running:
            if seq.seq_id not in kv:
                continue
            num_computed = seq.num_computed_tokens  # computed, or being computed by a step in flight
            for index, block in enumerate(kv.block_table(seq.seq_id)):
                in_block = min(bs, max(0, num_computed - index * bs))
                if in_block > filled.get(block, 0):
                    filled[block] = in_block
        return sum(filled.values()), kv.stats.num_used_blocks * bs

    def device_busy_s(self) -> float | None:
        """Seconds the device spent in steps, for runners that count it (the simulated ones); else None."""
        return self.runner.busy_s if self.runner.capabilities.counts_device_time else None

    @property
    def num_compiles(self) -> int:
        """Distinct step shapes the runner has compiled so far."""
        return self.runner.num_compiles

    @property
    def prefix_caching_enabled(self) -> bool:
        """Whether full blocks are cached and reused (off for the contiguous baseline and when disabled)."""
        return self.kv.enable_prefix_caching

    def cached_blocks(self) -> list[CachedBlockInfo]:
        """Every block in the device prefix cache, coldest first (block id, hash, parent hash, tokens, ref count)."""
        return self.kv.cached_blocks()

    def cached_prefix_tokens(self, prompt: list[int], cache_salt: str | None = None) -> int:
        """How many of `prompt`'s leading tokens the device prefix cache holds now (read-only: no hit counted)."""
        return self.kv.match_prefix(prompt, cache_salt=cache_salt).num_cached_tokens

    def missing_prompt_blocks(self, prompt: list[int], cache_salt: str | None = None) -> MissingBlocks:
        """The blocks of `prompt` admission could restore that neither the device cache nor the host tier holds
        (what a KV connector pulls; `KVTiers.missing_prompt_blocks`). ValueError without a host tier."""
        if self.tiers is None:
            raise ValueError("missing_prompt_blocks needs the host tier: set host_cache_bytes")
        return self.tiers.missing_prompt_blocks(prompt, cache_salt)

    def land_blocks(self, missing: MissingBlocks, blocks: list) -> None:
        """Put blocks computed elsewhere (`(key, data)`, keys of `missing`) in the host tier, where admission
        restores them (`KVTiers.land`). ValueError without a host tier."""
        if self.tiers is None:
            raise ValueError("land_blocks needs the host tier: set host_cache_bytes")
        self.tiers.land(missing, blocks)

    def cached_block_hashes(self) -> set[bytes]:
        """The hashes of every block in the device prefix cache."""
        return {block.block_hash for block in self.cached_blocks()}

    def enable_kv_events(self) -> None:
        """Start recording KV cache events (blocks stored / removed / cleared) for `take_kv_events`."""
        self.kv.enable_events()

    def take_kv_events(self) -> list[KVEvent]:
        """The KV cache events since the last call (empty unless `enable_kv_events` was called)."""
        return self.kv.take_events()

    def set_kv_scales(self, k_scale, v_scale) -> None:
        """Replace the fp8 KV pool's scales, each [num_layers, num_kv_heads] (pool data: no recompile)."""
        self.runner.set_kv_scales(k_scale, v_scale)

    def reset_prefix_cache(self, namespace: tuple[str, ...] | None = None) -> bool:
        """Forget every cached block of the device pool, then every cached (unpinned) block of the host
        tier, so no earlier prompt is a hit afterwards. False, and nothing cleared, while some device
        block is in use. The disk tier is kept: it is persistent storage that other engines may share,
        and its files are only served to an engine with the same identity.

        With ``namespace`` (a tenant's, `jaxpaged.cache.namespaces`): only the blocks whose chain's salt is
        in it are forgotten, never refused: the device pool's free cached ones, the host tier's entries and
        the disk tier's files (the tenant asked to forget its prompts, persistent copies included); blocks
        in use and other namespaces are kept."""
        if namespace is not None:
            if self.tiers is not None:
                self.tiers.drop_namespace(tuple(namespace))
            return self.kv.reset_prefix_cache(tuple(namespace))
        if not self.kv.reset_prefix_cache():
            return False
        if self.tiers is not None:
            self.tiers.host.clear_cached()
        return True
