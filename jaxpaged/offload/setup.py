"""Engine-side construction of the lower tiers from `EngineConfig` fields (validated there)."""

from __future__ import annotations

import numpy as np

from jaxpaged.offload.disk_tier import DiskKVCache
from jaxpaged.offload.host_tier import HostKVCache
from jaxpaged.offload.tiers import KVTiers


def build_tiers(config, kv, runner, host_cache_bytes: int | None = None) -> KVTiers | None:
    """The host (+ disk) tier behind `kv` if `config.host_cache_bytes` (or `host_cache_bytes`) is set, else None.

    `runner` must move blocks (`jaxpaged.runner.protocol.BlockMover`): the tiers copy its blocks.
    """
    host_cache_bytes = config.host_cache_bytes or host_cache_bytes
    if host_cache_bytes is None:
        return None
    shape = runner.kv_block_shape
    block_bytes = int(np.prod(shape)) * runner.kv_dtype.itemsize
    host = HostKVCache(host_cache_bytes, block_bytes)
    disk = None
    if config.disk_cache_dir is not None:
        disk = DiskKVCache(config.disk_cache_dir, config.disk_cache_bytes, block_bytes, runner.kv_dtype, shape)
    return KVTiers(kv, host, disk)
