"""Build a `LlamaModel` from a config and a set of weights, without random initialisation."""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpaged.config import ModelConfig
from jaxpaged.model.llama import LlamaModel

ParamPath = tuple[str | int, ...]


def _construct(config: ModelConfig, dtype) -> LlamaModel:
    return LlamaModel(config, rngs=nnx.Rngs(0), dtype=dtype)


def abstract_param_state(config: ModelConfig, dtype=None) -> nnx.State:
    """The model's `nnx.Param` state with `jax.ShapeDtypeStruct` leaves; no memory allocated."""
    return nnx.state(nnx.eval_shape(lambda: _construct(config, dtype)), nnx.Param)


def abstract_params(config: ModelConfig, dtype=None) -> dict[ParamPath, jax.ShapeDtypeStruct]:
    """Shape and dtype of every `nnx.Param`, keyed by its state path."""
    return {path: var.get_value() for path, var in nnx.to_flat_state(abstract_param_state(config, dtype))}


def assemble_model(config: ModelConfig, params: Mapping[ParamPath, np.ndarray | jax.Array],
                   dtype=None) -> LlamaModel:
    """A `LlamaModel` whose Params are `params` (cast to the model dtype).

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
        value = jnp.asarray(params[path], dtype=expected.dtype)
        if value.shape != expected.shape:
            raise ValueError(f"param {path}: expected shape {expected.shape}, got {value.shape}")
        var.set_value(value)
    derived = jax.jit(lambda: nnx.split(_construct(config, dtype), nnx.Param, ...)[2])()
    return nnx.merge(graphdef, nnx.from_flat_state(flat), derived)


def model_params(model: LlamaModel) -> dict[ParamPath, jax.Array]:
    """Every `nnx.Param` of `model`, keyed by its state path."""
    return {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
