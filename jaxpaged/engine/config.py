"""`EngineConfig`: everything that shapes an engine, each field declared once and validated once, on creation.

A field is declared with `knob(default, help, choices=...)`: its name, type
and default are the dataclass's, its help text and fixed values live on the
field (``dataclasses.fields(EngineConfig)[i].metadata``). The command line's
engine flags (`jaxpaged.cli.engine_flags`) are generated from these fields,
and `EngineConfig.describe()` gives Python users the same help.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from jaxpaged import compile_cache
from jaxpaged.attention.backend import BACKENDS
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cache.hashing import HASH_ALGOS
from jaxpaged.config import DEFAULT_BLOCK_SIZE, DTYPE_ALIASES, SUPPORTED_DTYPES, ModelConfig
from jaxpaged.kv_pool.fp8 import DEFAULT_SCALE_MARGIN
from jaxpaged.runner import cpu_step
from jaxpaged.scheduler import PREEMPTION_MODES
from jaxpaged.scheduler.policy import SCHEDULING_POLICIES
from jaxpaged.spec_decode.config import SpeculativeConfig
from jaxpaged.validation import (INT32_MAX, check_bool, check_float, check_int, check_optional_int,
                                 check_optional_str, check_str)

KV_LAYOUTS = ("paged", "contiguous")  # contiguous: the naive baseline, max_model_len reserved per sequence
KV_CACHE_DTYPES = ("auto", *SUPPORTED_DTYPES, *(a for a in DTYPE_ALIASES if a not in SUPPORTED_DTYPES))
DEFAULT_KV_CACHE_BYTES = 256 << 20
# the host controller keeps one object per block (~0.2 KB): 16M blocks (268M tokens at 16 per block) is past
# any real pool (an H200 holds ~2.6M blocks of the 'small' model) and a larger count is a sizing mistake
# (e.g. a simulated 80 GB device's budget spent on a tiny test model) that would take minutes and gigabytes
MAX_NUM_BLOCKS = 1 << 24


def knob(default, help: str, *, choices: Sequence[str] | None = None, flag: bool = True):  # noqa: A002
    """An `EngineConfig` field: its default, its help text, its fixed values (if any), and whether it is a flag.

    ``choices`` are checked by `EngineConfig` and become an enum flag's values;
    ``flag=False`` keeps a field off the command line (arrays, given through
    the Python API only).
    """
    if not help:
        raise ValueError("every EngineConfig field needs its help text")
    metadata = {"help": help, "flag": flag} | ({} if choices is None else {"choices": tuple(choices)})
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes an engine; `LLM(**kwargs)` fills it; `describe()` says what each field does."""

    model: str = knob("tiny", "a shipped model config name, a config JSON or a checkpoint directory")
    # the one default: flags, engine, runner and kernels read it from here
    block_size: int = knob(DEFAULT_BLOCK_SIZE, "tokens per KV block")
    num_blocks: int | None = knob(None, "KV pool blocks (default: as many as kv_cache_bytes holds)")
    kv_cache_bytes: int | None = knob(None, f"KV pool size in bytes (default {DEFAULT_KV_CACHE_BYTES >> 20} MiB)")
    enable_prefix_caching: bool = knob(True, "reuse cached blocks of shared prefixes (automatic prefix caching)")
    prefix_cache_snapshot: str | None = knob(None, "prefix-cache snapshot directory, restored at start if it exists")
    save_prefix_cache_on_shutdown: bool = knob(False, "write the prefix-cache snapshot at shutdown "
                                                      "(needs prefix_cache_snapshot)")
    max_num_seqs: int = knob(64, "most sequences running at once")
    max_num_batched_tokens: int = knob(512, "token budget of one step")
    max_model_len: int | None = knob(None, "longest prompt + output (default: the model's, capped by the pool)")
    async_scheduling: bool = knob(True, "schedule step N+1 while step N runs on the device (its sampled tokens "
                                        "stay there as N+1's inputs); beam search runs synchronously regardless")
    attention_backend: str = knob("auto", "attention backend", choices=BACKENDS)
    pallas_interpret: bool = knob(False, "run the Pallas kernel in interpret mode (CPU tests)")
    kv_cache_dtype: str = knob("auto", "KV cache dtype (auto = the model's; fp8_e4m3 stores scaled fp8)",
                               choices=KV_CACHE_DTYPES)
    dtype: str | None = knob(None, "weight and activation dtype (default: the model's)")
    seed: int = knob(0, "weights seed for shipped configs, and unseeded sampling")
    hash_algo: str = knob("sha256", "block hash of the prefix cache", choices=HASH_ALGOS)
    pool_fill_value: float = knob(0.0, "value of never-written KV slots (NaN proves stale slots never leak)")
    kv_layout: str = knob("paged", "paged, or contiguous: the naive baseline, max_model_len reserved per sequence",
                          choices=KV_LAYOUTS)
    kv_scales: tuple | None = knob(None, "fp8 KV: (k_scale, v_scale), each [num_layers, num_kv_heads]; "
                                         "None = calibrate on the first prefill", flag=False)
    kv_scale_margin: float = knob(DEFAULT_SCALE_MARGIN, "fp8 KV: headroom over the calibrated absmax scale")
    host_cache_bytes: int | None = knob(None, "host RAM tier for evicted cached blocks (bytes; off unless set)")
    disk_cache_dir: str | None = knob(None, "disk tier directory behind the host tier (needs host_cache_bytes)")
    disk_cache_bytes: int = knob(1 << 30, "disk tier size in bytes")
    preemption_mode: str = knob("recompute", "recompute, or swap: preempted blocks go to the host tier and back "
                                             "(needs host_cache_bytes)", choices=PREEMPTION_MODES)
    scheduling_policy: str = knob("fcfs", "which waiting request runs first and which running one is preempted: "
                                          "fcfs (arrival), priority (the request's priority, lower first, vLLM's "
                                          "meaning), or fair (per-tenant virtual token counters, OSDI'24 VTC)",
                                  choices=SCHEDULING_POLICIES)
    # one controller; num_blocks / kv_cache_bytes keep meaning the whole (logical) pool
    tensor_parallel_size: int = knob(1, "devices the weights and the KV pool's heads are split over (each holds "
                                        "1/N of the pool, or 1/num_kv_heads when N exceeds the KV heads)")
    eviction_policy: str = knob("lru", "which cached block at ref count 0 is evicted first",
                                choices=EVICTION_POLICIES)
    kv_cache_metrics_sample: float = knob(0.0, "fraction of cached blocks whose lifetime, idle-before-evict and "
                                               "reuse gaps are measured (0 = off)")
    speculative_config: SpeculativeConfig | None = knob(
        None, "speculative decoding, as vLLM's speculative_config: a JSON object (or dict) with method ('ngram': "
              "prompt lookup; 'draft_model': the checkpoint in model, with the target's vocabulary), "
              "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, model, "
              "disable_by_batch_size")
    # disaggregated prefill and decode (jaxpaged.kv_transfer, docs/disaggregation.md)
    kv_role: str = knob("none", "KV connector role: prefill (serves finished prompts' blocks to pullers), decode "
                                "(pulls the prompt blocks it lacks from kv_peers before admitting a request), "
                                "both, or none", choices=("none", "prefill", "decode", "both"))
    kv_transport: str = knob("auto", "how a prefill engine serves its KV blocks: jax (jax.experimental.transfer, "
                                     "device to device), zmq (host memory over ZeroMQ), or auto (jax where this "
                                     "process can start a transfer server, else zmq)", choices=("auto", "zmq", "jax"))
    kv_listen: str | None = knob(None, "prefill/both: the ZeroMQ endpoint serving KV pulls (tcp://host:port; "
                                       "port 0 picks one; default tcp://127.0.0.1:0)")
    kv_peers: str | None = knob(None, "decode/both: comma-separated endpoints of the prefill engines to pull from "
                                      "(unset: none until set at run time, as the Ray Serve ingress does)")
    kv_outbox_blocks: int = knob(4096, "prefill/both: finished prompts' blocks kept for pullers (LRU)")
    kv_transfer_timeout_s: float = knob(10.0, "decode/both: a pull with no whole answer by then fails and the "
                                              "prompt is computed here; prefill/both (jax transport): blocks "
                                              "offered to a puller and not pulled by then are dropped")
    kv_serve_delay_s: float = knob(0.0, "tests only: delay before each KV pull is answered")
    cpu_compiler_options: str = knob(cpu_step.AUTO, "XLA:CPU's dot path for the step, on the CPU platform only: "
                                     "auto (by weight dtype and step size, what was measured faster; none "
                                     "today), off (jaxlib's default, YNNPACK), or a preset for every step: "
                                     "eigen, ynn_eltwise (jaxpaged/runner/cpu_step.py)",
                                     choices=cpu_step.CHOICES)
    cpu_gemm: str = knob(cpu_step.AUTO, "who runs the model's weight GEMMs on the CPU platform (one device only): "
                         "xla (XLA's dot), onednn (a oneDNN matmul over the XLA FFI, every projection and the "
                         "LM head; needs the cpu extra), or auto (oneDNN by weight dtype and row count where it "
                         "was measured faster; jaxpaged/runner/cpu_step.py)", choices=cpu_step.GEMM_CHOICES)
    # process-wide, set when the engine is built (jaxpaged.compile_cache)
    compile_cache_dir: str | None = knob(compile_cache.AUTO, "persistent XLA compile cache: 'auto' (the per-user "
                                         "directory: $JAXPAGED_CACHE_DIR, else $XDG_CACHE_HOME/jaxpaged/xla or "
                                         "~/.cache/jaxpaged/xla), a directory, or '' (off)")

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Each field's help text, by name, in declaration order (what `--helpfull` shows for its flag)."""
        return {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}

    def __post_init__(self):
        """Check every field once, here: ValueError naming the field and its limit.

        Only the checks that need the model or a given runner (`kv_scales` shapes,
        `kv_cache_bytes` against one block, the runner's geometry, tensor-parallel
        splits, sliding-window support) wait for `EngineBuilder`.
        """
        # a dict or JSON text (the flag, the server's config) becomes a SpeculativeConfig, checked by it
        object.__setattr__(self, "speculative_config", SpeculativeConfig.from_value(self.speculative_config))
        self._check_types()
        self._check_choices()
        self._check_combinations()

    def _check_types(self) -> None:
        check_str("model", self.model)
        check_int("block_size", self.block_size, low=1, high=1 << 20)
        check_optional_int("num_blocks", self.num_blocks, low=1, high=MAX_NUM_BLOCKS)
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
        check_optional_str("kv_listen", self.kv_listen)
        check_optional_str("kv_peers", self.kv_peers)
        check_int("kv_outbox_blocks", self.kv_outbox_blocks, low=1, high=MAX_NUM_BLOCKS)
        check_float("kv_transfer_timeout_s", self.kv_transfer_timeout_s, low=0.001, high=3600.0)
        check_float("kv_serve_delay_s", self.kv_serve_delay_s, low=0.0, high=3600.0)


    def _check_choices(self) -> None:
        for field in dataclasses.fields(self):
            if "choices" in field.metadata:
                check_str(field.name, getattr(self, field.name), choices=field.metadata["choices"])
        if self.dtype is not None:
            _check_dtype_name("dtype", self.dtype)

    def _check_combinations(self) -> None:
        if self.save_prefix_cache_on_shutdown and not self.prefix_cache_snapshot:
            raise ValueError("save_prefix_cache_on_shutdown needs prefix_cache_snapshot (the directory)")
        if self.disk_cache_dir is not None and self.host_cache_bytes is None:
            raise ValueError("disk_cache_dir needs the host tier in front of it: set host_cache_bytes")
        if self.preemption_mode == "swap" and self.host_cache_bytes is None:
            raise ValueError("preemption_mode='swap' needs the host tier: set host_cache_bytes")
        if self.speculative_config is not None:
            if self.kv_layout != "paged":
                raise ValueError("speculative_config needs kv_layout='paged'")
        if self.kv_role != "none":
            if self.kv_layout != "paged" or not self.enable_prefix_caching:
                raise ValueError(f"kv_role={self.kv_role!r} needs kv_layout='paged' with enable_prefix_caching "
                                 "(blocks move by their hashes)")
        if self.host_cache_bytes is not None and self.kv_layout != "paged":
            raise ValueError("host_cache_bytes (the host tier) needs kv_layout='paged'")

    def resolve_num_blocks(self, model_config: ModelConfig, kv_dtype) -> int:
        """`num_blocks`, or as many blocks as `kv_cache_bytes` (default 256 MiB) holds at `kv_dtype`."""
        if self.num_blocks is not None:
            return self.num_blocks
        budget = self.kv_cache_bytes or DEFAULT_KV_CACHE_BYTES
        from jaxpaged.kv_pool.pool import pool_bytes  # a block spans the pool tensors (fewer with KV cache groups)
        per_block = pool_bytes(model_config, 1, self.block_size, np.dtype(kv_dtype))
        if budget < per_block:
            raise ValueError(f"kv_cache_bytes={budget} is smaller than one block ({per_block} bytes)")
        if budget // per_block > MAX_NUM_BLOCKS:
            raise ValueError(f"kv_cache_bytes={budget} holds {budget // per_block} blocks of {per_block} bytes; "
                             f"at most {MAX_NUM_BLOCKS} (num_blocks' limit): give a smaller kv_cache_bytes")
        return budget // per_block


def _check_dtype_name(name: str, value) -> None:
    """ValueError naming `name` unless `value` is a supported dtype name or an alias."""
    check_str(name, value)
    if DTYPE_ALIASES.get(value, value) not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} must be one of {SUPPORTED_DTYPES} or an alias {tuple(DTYPE_ALIASES)}, "
                         f"got {value!r}")
