"""Engine flags generated from `EngineConfig`'s fields, and flags back into an `EngineConfig`.

Each field becomes one absl flag of the same name, type and default (an
``int | None`` field an integer flag defaulting to None, a ``bool`` a boolean
flag, ...); fields with a fixed set of values become enum flags. The values
are checked once, by `EngineConfig` itself, right after parsing: a bad one is
the usual one-line flag error naming the field. Commands pick the fields they
expose and may change a default (a benchmark's own workload size), never the
block size's.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Iterable, Mapping

from absl import flags

from jaxpaged.attention.backend import BACKENDS
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cache.hashing import HASH_ALGOS
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.engine import EngineConfig
from jaxpaged.scheduler import PREEMPTION_MODES

KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "fp8_e4m3")
CHOICES: dict[str, tuple[str, ...]] = {
    "attention_backend": BACKENDS, "kv_cache_dtype": KV_CACHE_DTYPES, "hash_algo": HASH_ALGOS,
    "kv_layout": ("paged", "contiguous"), "preemption_mode": PREEMPTION_MODES,
    "eviction_policy": EVICTION_POLICIES,
}
# fields no command line sets: arrays, given through the Python API only
NOT_FLAGS = frozenset({"kv_scales"})
HELP = {
    "model": "a shipped model config name, a config JSON or a checkpoint directory",
    "block_size": "tokens per KV block",
    "num_blocks": "KV pool blocks (default: as many as --kv_cache_bytes holds)",
    "kv_cache_bytes": "KV pool size in bytes (default 256 MiB)",
    "enable_prefix_caching": "reuse cached blocks of shared prefixes (automatic prefix caching)",
    "prefix_cache_snapshot": "prefix-cache snapshot directory, restored at start if it exists",
    "save_prefix_cache_on_shutdown": "write the prefix-cache snapshot at shutdown",
    "max_num_seqs": "most sequences running at once",
    "max_num_batched_tokens": "token budget of one step",
    "max_model_len": "longest prompt + output (default: the model's, capped by the pool)",
    "async_scheduling": "schedule step N+1 while step N runs on the device",
    "attention_backend": "attention backend",
    "pallas_interpret": "run the Pallas kernel in interpret mode (CPU tests)",
    "kv_cache_dtype": "KV cache dtype (auto = the model's)",
    "dtype": "weight and activation dtype (default: the model's)",
    "seed": "weights seed for shipped configs, and unseeded sampling",
    "hash_algo": "block hash of the prefix cache",
    "pool_fill_value": "value of never-written KV slots (NaN proves stale slots never leak)",
    "kv_layout": "paged, or contiguous: the naive baseline, max_model_len reserved per sequence",
    "kv_scale_margin": "fp8 KV: headroom over the calibrated absmax scale",
    "host_cache_bytes": "host RAM tier for evicted cached blocks (bytes; off unless set)",
    "disk_cache_dir": "disk tier directory behind the host tier",
    "disk_cache_bytes": "disk tier size in bytes",
    "preemption_mode": "recompute, or swap: preempted blocks go to the host tier and back",
    "tensor_parallel_size": "devices the weights and the KV pool's heads are split over",
    "eviction_policy": "which cached block at ref count 0 is evicted first",
    "kv_cache_metrics_sample": "fraction of cached blocks whose lifetime, idle-before-evict and reuse gaps are "
                               "measured (0 = off)",
    "compile_cache_dir": "persistent XLA compile cache: 'auto' (the per-user directory: $JAXPAGED_CACHE_DIR, "
                         "else $XDG_CACHE_HOME/jaxpaged/xla or ~/.cache/jaxpaged/xla), a directory, or '' (off)",
}


def engine_fields() -> list[dataclasses.Field]:
    """The `EngineConfig` fields that are flags, in declaration order."""
    return [f for f in dataclasses.fields(EngineConfig) if f.name not in NOT_FLAGS]


def _kind(field: dataclasses.Field) -> type:
    hint = typing.get_type_hints(EngineConfig)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    args = [str if isinstance(a, type) and issubclass(a, os.PathLike) else a for a in args]  # a path: its text
    if len(args) != 1 or args[0] not in (bool, int, float, str):
        raise TypeError(f"EngineConfig.{field.name}: no flag type for {hint} (add it to NOT_FLAGS or here)")
    return args[0]


def _help(field: dataclasses.Field) -> str:
    text = field.metadata.get("help") or HELP.get(field.name) or f"EngineConfig.{field.name}"
    return f"{text} (EngineConfig.{field.name})"


class EngineFlags:
    """Some or all `EngineConfig` fields as flags on one command's `FlagSet`."""

    def __init__(self, fs: FlagSet, fields: Iterable[str] | None = None, *,
                 defaults: Mapping[str, object] | None = None) -> None:
        """Define a flag per field in ``fields`` (default: every flag field) on ``fs``.

        ``defaults`` replaces a field's default for this command; the block size keeps EngineConfig's.
        """
        defaults = dict(defaults or {})
        if "block_size" in defaults:
            raise ValueError("block_size's default is EngineConfig's: a command may not change it")
        by_name = {f.name: f for f in engine_fields()}
        names = list(by_name) if fields is None else list(fields)
        unknown = [n for n in [*names, *defaults] if n not in by_name]
        if unknown:
            raise ValueError(f"not EngineConfig flag fields: {unknown}")
        self.holders: dict[str, flags.FlagHolder] = {}
        for name in names:
            field = by_name[name]
            default = defaults.get(name, field.default)
            kind = _kind(field)
            if name in CHOICES:
                holder = fs.DEFINE_enum(name, default, list(CHOICES[name]), _help(field))
            else:
                define = {bool: fs.DEFINE_boolean, int: fs.DEFINE_integer, float: fs.DEFINE_float,
                          str: fs.DEFINE_string}[kind]
                holder = define(name, default, _help(field))
            self.holders[name] = holder
        if "model" in self.holders:
            fs.model_name("model")
        fs.after_parse(self._check)

    def kwargs(self) -> dict[str, object]:
        """The parsed flags as `EngineConfig` keyword arguments."""
        return {name: holder.value for name, holder in self.holders.items()}

    def config(self, **overrides) -> EngineConfig:
        """The `EngineConfig` of the flags, with ``overrides`` (fields a command derives) on top."""
        return EngineConfig(**(self.kwargs() | overrides))

    def _check(self, values: flags.FlagValues) -> None:
        try:
            EngineConfig(**{name: values[name].value for name in self.holders})
        except ValueError as error:
            message = str(error)
            found = {m.start(): n for n in self.holders if (m := re.search(rf"\b{n}\b", message))}
            where = f"flag --{found[min(found)]}={values[found[min(found)]].value}" if found else "engine flags"
            raise flags.IllegalFlagValueError(f"{where}: {message}") from None
