"""Device-side KV state: the paged pool as a pytree, and the pure ops that write and copy it."""

from jaxpaged.kv_pool.pool import (
    KVPool,
    copy_blocks,
    create_pool,
    kv_dtype_from_name,
    pool_bytes,
    write_layer_kv,
)

__all__ = ["KVPool", "copy_blocks", "create_pool", "kv_dtype_from_name", "pool_bytes", "write_layer_kv"]
