"""Build a `DecoderModel` from a config and a set of weights, without random initialisation."""

from __future__ import annotations

from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpaged.config import ModelConfig
from jaxpaged.model.decoder import DecoderModel

ParamPath = tuple[str | int, ...]


def _construct(config: ModelConfig, dtype) -> DecoderModel:
    return DecoderModel(config, rngs=nnx.Rngs(0), dtype=dtype)


def abstract_param_state(config: ModelConfig, dtype=None) -> nnx.State:
    """The model's `nnx.Param` state with `jax.ShapeDtypeStruct` leaves; no memory allocated."""
    return nnx.state(nnx.eval_shape(lambda: _construct(config, dtype)), nnx.Param)


def abstract_params(config: ModelConfig, dtype=None) -> dict[ParamPath, jax.ShapeDtypeStruct]:
    """Shape and dtype of every `nnx.Param`, keyed by its state path."""
    return {path: var.get_value() for path, var in nnx.to_flat_state(abstract_param_state(config, dtype))}


ShardingOf = Callable[[ParamPath, tuple[int, ...]], jax.sharding.Sharding]


def assemble_model(config: ModelConfig, params: Mapping[ParamPath, np.ndarray | jax.Array],
                   dtype=None, sharding_of: ShardingOf | None = None) -> DecoderModel:
    """A `DecoderModel` whose Params are `params` (cast to the model dtype).

    With `sharding_of(path, shape)` (tensor parallelism) each host weight is cut
    into its per-device slices on the host and each slice cast and sent to its
    own device: no device holds a full copy of a split weight.

    `params` must hold exactly the paths of `abstract_params(config, dtype)`, with
    the same shapes; callers validate against that first to give a useful error.
    Non-Param variables (RoPE tables) are derived from the config: the constructor
    runs under `jax.jit` with only those as outputs, so XLA drops the random init.
    """
    if dtype is not None:  # keep config.dtype truthful: the engine sizes the KV cache from it
        config = config.replace(dtype=jnp.dtype(dtype).name)
    abstract = nnx.eval_shape(lambda: _construct(config, dtype))
    graphdef, param_state, _ = nnx.split(abstract, nnx.Param, ...)
    flat = nnx.to_flat_state(param_state)
    for path, var in flat:
        expected = var.get_value()
        value = params[path]
        if tuple(np.shape(value)) != tuple(expected.shape):
            raise ValueError(f"param {path}: expected shape {expected.shape}, got {np.shape(value)}")
        if sharding_of is None:
            var.set_value(jnp.asarray(value, dtype=expected.dtype))
        else:
            var.set_value(_place(value, expected.dtype, sharding_of(path, tuple(expected.shape))))
    derived = jax.jit(lambda: nnx.split(_construct(config, dtype), nnx.Param, ...)[2])()
    return nnx.merge(graphdef, nnx.from_flat_state(flat), derived)


def _place(value, dtype, sharding) -> jax.Array:
    if isinstance(value, jax.Array):  # e.g. restored by Orbax straight into its shards
        value = value.astype(dtype)
        return value if value.sharding == sharding else jax.device_put(value, sharding)
    return jax.make_array_from_callback(np.shape(value), sharding,
                                        lambda index: np.asarray(value[index]).astype(dtype))


def model_params(model: DecoderModel) -> dict[ParamPath, jax.Array]:
    """Every `nnx.Param` of `model`, keyed by its state path."""
    return {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
