"""`DeploymentFlags`: a simulated deployment's flags (device profile, precisions, KV size, engine fields), once:
the `simulate` commands describe the served model the same way, and get the `Deployment` back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from absl import app

from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.sim.scenario import Deployment

SIM_ENGINE_DEFAULTS = {"model": "llama3-8b", "max_num_seqs": 256, "max_num_batched_tokens": 2048}


class DeploymentFlags:
    """``--profile``, ``--weight_bytes_per_param``, ``--kv_bytes_per_element``, ``--kv_cache_gb`` and engine fields."""

    def __init__(self, fs: FlagSet, engine_fields: Sequence[str], *, profile: str = "a100-80gb",
                 profile_help: str = "", kv_cache_gb: float | None = None,
                 kv_cache_help: str = "KV cache per device in GB (1e9); default: 90% of memory - the device's weights",
                 engine_defaults: Mapping[str, object] | None = None) -> None:
        """Define the flags on ``fs`` (``engine_defaults`` on top of `SIM_ENGINE_DEFAULTS`)."""
        self._profile = fs.DEFINE_string("profile", profile, "a100-80gb, h100-80gb, h200-141gb, cpu, or a profile "
                                         "JSON" + profile_help)
        self._weight_bytes = fs.DEFINE_float("weight_bytes_per_param", 2.0, "2 = bf16, 1 = fp8/int8, 0.5 = 4-bit")
        self._kv_bytes = fs.DEFINE_float("kv_bytes_per_element", 2.0, "2 = bf16/fp16 KV, 1 = fp8 KV")
        self._kv_cache_gb = fs.DEFINE_float("kv_cache_gb", kv_cache_gb, kv_cache_help)
        defaults = {k: v for k, v in {**SIM_ENGINE_DEFAULTS, **(engine_defaults or {})}.items() if k in engine_fields}
        self.engine = EngineFlags(fs, engine_fields, defaults=defaults)
        fs.device_profile("profile")
        fs.at_least(1e-3, "weight_bytes_per_param", "kv_bytes_per_element")
        fs.at_least(1e-6, "kv_cache_gb")  # a pool too small for a block is refused by `deployment`

    def deployment(self, **extra) -> Deployment:
        """The deployment the flags describe; a usage error (naming the flags) when its pool cannot be sized."""
        gb = self._kv_cache_gb.value
        d = Deployment(profile=self._profile.value, weight_bytes_per_param=self._weight_bytes.value,
                       kv_bytes_per_element=self._kv_bytes.value, kv_cache_bytes=None if gb is None else int(gb * 1e9),
                       **(self.engine.kwargs() | extra))
        try:
            d.num_blocks()
        except ValueError as error:
            raise app.UsageError(f"{error} (--kv_cache_gb, --tensor_parallel_size)") from None
        return d
