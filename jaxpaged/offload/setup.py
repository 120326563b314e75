"""Engine-side construction and validation of the lower tiers from `EngineConfig` fields."""

from __future__ import annotations

import numpy as np

from jaxpaged.offload.disk_tier import DiskKVCache
from jaxpaged.offload.host_tier import HostKVCache
from jaxpaged.offload.tiers import KVTiers


def validate_tier_options(config) -> None:
    """Raise ValueError (naming the limit) for inconsistent tier options of an `EngineConfig`."""
    host = config.host_cache_bytes
    if host is not None and (isinstance(host, bool) or not isinstance(host, int) or host <= 0):
        raise ValueError(f"host_cache_bytes must be a positive int (bytes) or None, got {host!r}")
    if config.disk_cache_dir is not None and host is None:
        raise ValueError("disk_cache_dir needs the host tier in front of it: set host_cache_bytes")
    if config.disk_cache_bytes <= 0:
        raise ValueError(f"disk_cache_bytes must be positive, got {config.disk_cache_bytes}")
    if config.preemption_mode == "swap" and host is None:
        raise ValueError("preemption_mode='swap' needs the host tier: set host_cache_bytes")
    if host is not None and config.kv_layout != "paged":
        raise ValueError("the host tier needs kv_layout='paged'")


def build_tiers(config, kv, runner) -> KVTiers | None:
    """The host (+ disk) tier behind `kv` if `config.host_cache_bytes` is set, else None.

    `runner` must own a device pool (`jaxpaged.runner.KVPoolRunner`): the tiers move its blocks.
    """
    if config.host_cache_bytes is None:
        return None
    shape = runner.kv_block_shape
    block_bytes = int(np.prod(shape)) * runner.kv_dtype.itemsize
    host = HostKVCache(config.host_cache_bytes, block_bytes)
    disk = None
    if config.disk_cache_dir is not None:
        disk = DiskKVCache(config.disk_cache_dir, config.disk_cache_bytes, block_bytes, runner.kv_dtype, shape)
    return KVTiers(kv, host, disk)
