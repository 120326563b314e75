"""Host-side KV cache manager: block pool, chained-hash prefix cache, ref counts, CoW.

Pure Python + numpy; importing it does not import JAX.
"""

from jaxpaged.cache.block_pool import BlockPool, FreeBlockQueue, KVBlock
from jaxpaged.cache.hashing import (
    HASH_ALGOS,
    chain_block_hashes,
    hash_block_tokens,
    hash_request_blocks,
)
from jaxpaged.cache.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventLog, replay
from jaxpaged.cache.kv_cache_manager import KVCacheManager
from jaxpaged.cache.protocol import KVManager
from jaxpaged.cache.records import NO_CHANGE, BlockTableUpdate, CacheStats, PrefixMatch

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventLog",
    "replay",
    "HASH_ALGOS",
    "NO_CHANGE",
    "BlockPool",
    "BlockTableUpdate",
    "CacheStats",
    "FreeBlockQueue",
    "KVBlock",
    "KVCacheManager",
    "KVManager",
    "PrefixMatch",
    "chain_block_hashes",
    "hash_block_tokens",
    "hash_request_blocks",
]
