"""`SnapshotParts`: what a prefix-cache snapshot reads and writes; the engine's `EngineParts` is one."""

from __future__ import annotations

from typing import Any, Protocol

from jaxpaged.cache import KVManager
from jaxpaged.config import ModelConfig
from jaxpaged.offload.tiers import KVTiers
from jaxpaged.runner import KVPoolRunner


class SnapshotParts(Protocol):
    """The KV manager (cached blocks), the runner (the pool's K/V and fp8 scales), the lower tiers, and
    what the engine's identity is made of, and what it is tied to (the disk tier's files, the KV connector's
    transfers). The engine hands its `EngineParts`, which has all of these."""

    config: Any  # the engine's EngineConfig: its `hash_algo` is part of the identity
    model_config: ModelConfig
    block_size: int
    runner: KVPoolRunner
    kv: KVManager
    tiers: KVTiers | None
    kv_connector: Any  # a `jaxpaged.kv_transfer.PeerKVConnector` (its transfers carry the identity), or None
