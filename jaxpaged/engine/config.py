"""`EngineConfig`: everything that shapes an engine, each field validated once, on creation."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jaxpaged import compile_cache
from jaxpaged.attention.backend import BACKENDS
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cache.hashing import HASH_ALGOS
from jaxpaged.config import DEFAULT_BLOCK_SIZE, DTYPE_ALIASES, SUPPORTED_DTYPES, ModelConfig
from jaxpaged.kv.fp8 import DEFAULT_SCALE_MARGIN
from jaxpaged.scheduler import PREEMPTION_MODES
from jaxpaged.validation import (INT32_MAX, check_bool, check_float, check_int, check_optional_int,
                                 check_optional_str, check_str)

KV_LAYOUTS = ("paged", "contiguous")  # contiguous: the naive baseline, max_model_len reserved per sequence
DEFAULT_KV_CACHE_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes an engine; `LLM(**kwargs)` fills it."""

    model: str = "tiny"
    block_size: int = DEFAULT_BLOCK_SIZE  # the one default: flags, engine, runner and kernels read it from here
    num_blocks: int | None = None  # or derive it from kv_cache_bytes
    kv_cache_bytes: int | None = None
    enable_prefix_caching: bool = True
    prefix_cache_snapshot: str | None = None  # directory: restored at start if it exists
    save_prefix_cache_on_shutdown: bool = False  # shutdown() writes the snapshot there
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # default: the model's, capped by the pool
    # schedule step N+1 while step N runs on the device (its sampled tokens stay there as N+1's inputs);
    # beam search runs synchronously regardless
    async_scheduling: bool = True
    attention_backend: str = "auto"
    pallas_interpret: bool = False
    kv_cache_dtype: str = "auto"
    dtype: str | None = None
    seed: int = 0
    hash_algo: str = "sha256"
    pool_fill_value: float = 0.0  # NaN in tests proves stale slots never leak
    kv_layout: str = "paged"  # or "contiguous": the naive baseline, max_model_len reserved per sequence
    # fp8 KV: (k_scale, v_scale), each [num_layers, num_kv_heads]; None = calibrate on the first prefill
    kv_scales: tuple | None = None
    kv_scale_margin: float = DEFAULT_SCALE_MARGIN
    # lower tiers: host RAM cache of evicted cached blocks (off unless set), optional disk cache behind it
    host_cache_bytes: int | None = None
    disk_cache_dir: str | None = None
    disk_cache_bytes: int = 1 << 30
    preemption_mode: str = "recompute"  # or "swap": preempted blocks go to the host tier and back
    # split weights and the KV pool's heads over this many devices (jaxpaged.parallel); one controller.
    # num_blocks / kv_cache_bytes keep meaning the whole (logical) pool: each device holds 1/N of it
    # (1/num_kv_heads when N exceeds the KV heads and they are replicated)
    tensor_parallel_size: int = 1
    # which cached block at ref count 0 is evicted first: lru, lfu, sieve, slru (jaxpaged.cache.eviction)
    eviction_policy: str = "lru"
    # fraction of cached blocks whose lifetime / idle-before-evict / reuse gaps are measured (0 = off)
    kv_cache_metrics_sample: float = 0.0
    # persistent XLA compilation cache (process-wide, set when the engine is built): "auto" = the per-user
    # directory ($JAXPAGED_CACHE_DIR, else $XDG_CACHE_HOME/jaxpaged/xla or ~/.cache/jaxpaged/xla; see
    # jaxpaged.compile_cache), a directory, or ""/None = off
    compile_cache_dir: str | None = compile_cache.AUTO

    def __post_init__(self):
        """Check every field once, here: ValueError naming the field and its limit.

        Only the checks that need the model or a given runner (`kv_scales` shapes,
        `kv_cache_bytes` against one block, the runner's geometry, tensor-parallel
        splits, sliding-window support) wait for `EngineBuilder`.
        """
        self._check_types()
        self._check_choices()
        self._check_combinations()

    def _check_types(self) -> None:
        check_str("model", self.model)
        check_int("block_size", self.block_size, low=1, high=1 << 20)
        check_optional_int("num_blocks", self.num_blocks, low=1, high=INT32_MAX)
        check_optional_int("kv_cache_bytes", self.kv_cache_bytes, low=1)
        check_int("max_num_seqs", self.max_num_seqs, low=1, high=INT32_MAX)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, low=1, high=INT32_MAX)
        check_optional_int("max_model_len", self.max_model_len, low=1, high=INT32_MAX)
        check_int("seed", self.seed, low=0, high=2**32 - 1)  # seeds the random weights too
        check_optional_int("host_cache_bytes", self.host_cache_bytes, low=1)
        check_int("disk_cache_bytes", self.disk_cache_bytes, low=1)
        check_int("tensor_parallel_size", self.tensor_parallel_size, low=1, high=1 << 16)
        check_float("pool_fill_value", self.pool_fill_value, allow_nan=True)
        check_float("kv_scale_margin", self.kv_scale_margin, low=1.0)
        check_float("kv_cache_metrics_sample", self.kv_cache_metrics_sample, low=0.0, high=1.0)
        for name in ("enable_prefix_caching", "save_prefix_cache_on_shutdown", "async_scheduling",
                     "pallas_interpret"):
            check_bool(name, getattr(self, name))
        check_optional_str("prefix_cache_snapshot", self.prefix_cache_snapshot)
        if self.disk_cache_dir is not None and not isinstance(self.disk_cache_dir, (str, os.PathLike)):
            raise ValueError(f"disk_cache_dir must be a path, got {self.disk_cache_dir!r}")
        is_pair = isinstance(self.kv_scales, (tuple, list)) and len(self.kv_scales) == 2
        if self.kv_scales is not None and not is_pair:
            raise ValueError(f"kv_scales must be None or a pair (k_scale, v_scale), "
                             f"got {type(self.kv_scales).__name__}")
        compile_cache.validate_setting("compile_cache_dir", self.compile_cache_dir)

    def _check_choices(self) -> None:
        check_str("attention_backend", self.attention_backend, choices=BACKENDS)
        check_str("hash_algo", self.hash_algo, choices=HASH_ALGOS)
        check_str("kv_layout", self.kv_layout, choices=KV_LAYOUTS)
        check_str("preemption_mode", self.preemption_mode, choices=PREEMPTION_MODES)
        check_str("eviction_policy", self.eviction_policy, choices=EVICTION_POLICIES)
        _check_dtype_name("kv_cache_dtype", self.kv_cache_dtype, also=("auto",))
        if self.dtype is not None:
            _check_dtype_name("dtype", self.dtype)

    def _check_combinations(self) -> None:
        if self.save_prefix_cache_on_shutdown and not self.prefix_cache_snapshot:
            raise ValueError("save_prefix_cache_on_shutdown needs prefix_cache_snapshot (the directory)")
        if self.disk_cache_dir is not None and self.host_cache_bytes is None:
            raise ValueError("disk_cache_dir needs the host tier in front of it: set host_cache_bytes")
        if self.preemption_mode == "swap" and self.host_cache_bytes is None:
            raise ValueError("preemption_mode='swap' needs the host tier: set host_cache_bytes")
        if self.host_cache_bytes is not None and self.kv_layout != "paged":
            raise ValueError("host_cache_bytes (the host tier) needs kv_layout='paged'")

    def resolve_num_blocks(self, model_config: ModelConfig, kv_dtype) -> int:
        """`num_blocks`, or as many blocks as `kv_cache_bytes` (default 256 MiB) holds at `kv_dtype`."""
        if self.num_blocks is not None:
            return self.num_blocks
        budget = self.kv_cache_bytes or DEFAULT_KV_CACHE_BYTES
        from jaxpaged.kv.pool import pool_bytes  # a block spans the pool tensors (fewer with KV cache groups)
        per_block = pool_bytes(model_config, 1, self.block_size, np.dtype(kv_dtype))
        if budget < per_block:
            raise ValueError(f"kv_cache_bytes={budget} is smaller than one block ({per_block} bytes)")
        return budget // per_block


def _check_dtype_name(name: str, value, *, also: tuple[str, ...] = ()) -> None:
    """ValueError naming `name` unless `value` is a supported dtype name, an alias, or one of `also`."""
    check_str(name, value)
    if value not in also and DTYPE_ALIASES.get(value, value) not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} must be one of {also + SUPPORTED_DTYPES} or an alias {tuple(DTYPE_ALIASES)}, "
                         f"got {value!r}")
