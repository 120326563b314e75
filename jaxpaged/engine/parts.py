"""`EngineParts`: what an engine is made of, as `EngineBuilder.build` hands it over.

The engine loops over these parts and keeps no copy of them (`engine.kv` reads
`parts.kv`); its persistence (`jaxpaged.snapshot`) is handed them too (they
are the `SnapshotParts` that package declares). `max_model_len` and
`num_blocks` are the effective values the builder settled, not the config's.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jaxpaged.cache import KVManager
from jaxpaged.config import ModelConfig
from jaxpaged.engine.config import EngineConfig
from jaxpaged.engine.input_processor import InputProcessor
from jaxpaged.engine.output_processor import OutputProcessor
from jaxpaged.offload.tiers import KVTiers
from jaxpaged.runner import Runner
from jaxpaged.scheduler import Scheduler


@dataclasses.dataclass
class EngineParts:
    """What `EngineBuilder.build` assembles: the engine's parts and the numbers they were sized by."""

    config: EngineConfig
    clock: Callable[[], float]
    model_config: ModelConfig
    num_blocks: int
    block_size: int
    max_model_len: int
    runner: Runner
    kv: KVManager
    tiers: KVTiers | None
    scheduler: Scheduler
    input_processor: InputProcessor
    output_processor: OutputProcessor
    calibrate_kv_scales: bool  # fp8 without given scales: calibrate on the first prefill
    kv_connector: object | None = None  # a jaxpaged.kv_transfer.PeerKVConnector when kv_role is set
