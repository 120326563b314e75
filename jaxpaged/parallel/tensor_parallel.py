"""Tensor parallelism over a `jax.sharding.Mesh`: which device holds which slice of the weights and pool.

Megatron-style sharding over one mesh axis (`tp`) of N devices:

- q/k/v and gate/up projections are split by output columns (each device owns
  whole heads / a slice of the MLP), o and down projections by input rows (XLA
  adds one all-reduce after each), embeddings and the LM head by vocabulary;
  q/k/v biases split with their columns; norms (q/k norms too: they act
  within a head), the o bias and the RoPE tables are replicated.
- The KV pool is split on its KV-head axis: every device holds its heads of
  every block, so block ids and block tables mean the same thing everywhere
  and the host controller is unchanged (one controller, N devices).
- When N exceeds the model's KV heads (N a multiple of them), each KV head is
  replicated N / kv_heads times, as vLLM does: the k/v projections are widened
  to N heads (head j is a copy of logical head j // r), which is the same model
  with a pool of N physical KV heads, one per device. The runner shows the
  outside world logical heads only (block reads and writes, fp8 scales).

`TensorParallel.validate` raises a ValueError for an N that fits neither way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpaged.config import ModelConfig

TP_AXIS = "tp"

# Param paths end in (module name, variable name); the module name decides the split.
_COLUMN_SPLIT = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head"}  # [in, out]: split out
_ROW_SPLIT = {"o_proj", "down_proj"}  # [in, out]: split in
_KV_PROJ = {"k_proj", "v_proj"}

ParamPath = tuple


def validate_tensor_parallel_size(config: ModelConfig, size: int) -> None:
    """Raise ValueError unless `size` devices can split `config` (heads, KV heads, MLP) and are visible."""
    config.check_tensor_parallel(size)
    if size == 1:
        return
    available = len(jax.devices())
    if size > available:
        raise ValueError(f"tensor_parallel_size={size} needs {size} devices; {available} are visible "
                         f"({jax.default_backend()}; on CPU set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={size})")


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """How a model is split over `size` devices (the first `size` of `jax.devices()`)."""

    config: ModelConfig  # the logical model
    size: int
    mesh: Mesh

    @classmethod
    def create(cls, config: ModelConfig, size: int) -> "TensorParallel":
        """Validate `size` for `config` and build the 1-D mesh over the first `size` devices."""
        validate_tensor_parallel_size(config, size)
        devices = np.array(jax.devices()[:size])
        return cls(config, size, Mesh(devices, (TP_AXIS,)))

    # ---- KV heads -----------------------------------------------------------------------------

    @property
    def kv_replicas(self) -> int:
        """Copies of each logical KV head (1 unless N exceeds the KV heads)."""
        return max(1, self.size // self.config.num_kv_heads)

    @property
    def physical_config(self) -> ModelConfig:
        """The config the sharded model and pool are built with (`num_kv_heads` widened when replicated)."""
        if self.kv_replicas == 1:
            return self.config
        return self.config.replace(num_kv_heads=self.config.num_kv_heads * self.kv_replicas)

    def to_physical_heads(self, array: np.ndarray, axis: int) -> np.ndarray:
        """Repeat each logical KV head `kv_replicas` times along `axis`."""
        return array if self.kv_replicas == 1 else np.repeat(array, self.kv_replicas, axis=axis)

    def to_logical_heads(self, array: np.ndarray, axis: int) -> np.ndarray:
        """Keep one copy of each replicated KV head along `axis`."""
        if self.kv_replicas == 1:
            return array
        return np.take(array, np.arange(0, array.shape[axis], self.kv_replicas), axis=axis)

    # ---- shardings ----------------------------------------------------------------------------

    def sharding(self, spec: P) -> NamedSharding:
        """`spec` on this mesh."""
        return NamedSharding(self.mesh, spec)

    @property
    def replicated(self) -> NamedSharding:
        """Every device holds the whole array (step inputs, block tables, sampled tokens)."""
        return self.sharding(P())

    @property
    def pool_pages(self) -> NamedSharding:
        """One layer's K or V pages `[Hkv, N, B, D]`: split on the KV-head axis."""
        return self.sharding(P(TP_AXIS))

    @property
    def pool_scales(self) -> NamedSharding:
        """fp8 scales `[L, Hkv]`: split like the heads they scale."""
        return self.sharding(P(None, TP_AXIS))

    def param_spec(self, path: ParamPath, shape: tuple[int, ...]) -> P:
        """The partition of the (physical) parameter at `path`; replicated where a split would be uneven."""
        module = path[-2] if len(path) >= 2 else None
        if module in _COLUMN_SPLIT and len(shape) == 2 and shape[1] % self.size == 0:
            return P(None, TP_AXIS)
        if module in _COLUMN_SPLIT and len(shape) == 1 and shape[0] % self.size == 0:
            return P(TP_AXIS)  # a column-split projection's bias
        if module in _ROW_SPLIT and len(shape) == 2 and shape[0] % self.size == 0:
            return P(TP_AXIS, None)
        if module == "embed_tokens" and len(shape) == 2 and shape[0] % self.size == 0:
            return P(TP_AXIS, None)  # vocabulary rows
        return P()

    def param_sharding(self, path: ParamPath, shape: tuple[int, ...]) -> NamedSharding:
        """`param_spec` on this mesh."""
        return self.sharding(self.param_spec(path, shape))

    # ---- placing weights ----------------------------------------------------------------------

    def physical_param(self, path: ParamPath, value: np.ndarray) -> np.ndarray:
        """The host value of a logical parameter as the sharded model holds it (k/v widened if replicated)."""
        module = path[-2] if len(path) >= 2 else None
        if module not in _KV_PROJ or self.kv_replicas == 1:
            return value
        lead = value.shape[:-1]  # `[hidden]` for a kernel, `[]` for a bias
        heads = value.reshape(*lead, self.config.num_kv_heads, self.config.head_dim)
        return self.to_physical_heads(heads, axis=-2).reshape(*lead, -1)

    def place_params(self, params: Mapping[ParamPath, Callable[[], np.ndarray] | np.ndarray | jax.Array]
                     ) -> dict[ParamPath, jax.Array]:
        """Put each logical parameter on the mesh, every device receiving only its own slice.

        Values may be host arrays, device arrays or zero-argument callables that
        produce a host array (read lazily, e.g. from a memory-mapped safetensors
        file). Each device's shard is cut on the host and transferred to that
        device alone (`jax.make_array_from_callback`): no device ever holds a
        full copy of a split weight, and in a multi-process run each process
        transfers only to its own devices.
        """
        placed = {}
        for path, value in params.items():
            host = np.asarray(value() if callable(value) else value)
            host = self.physical_param(path, host)
            sharding = self.param_sharding(path, host.shape)
            placed[path] = jax.make_array_from_callback(host.shape, sharding, lambda index, h=host: h[index])
        return placed

    def put_replicated(self, tree):
        """Put a pytree of host arrays on every device of the mesh (identical in every process)."""
        return jax.tree.map(lambda x: jax.make_array_from_callback(
            np.shape(x), self.replicated, lambda index, h=np.asarray(x): h[index]), tree)

    def put(self, array: np.ndarray, sharding: NamedSharding) -> jax.Array:
        """Put one host array on the mesh with `sharding` (each device gets its slice only)."""
        host = np.asarray(array)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
