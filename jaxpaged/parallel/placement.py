"""Putting a model's weights on a tensor-parallel mesh: a given model, random weights, or checkpoint tensors."""

from __future__ import annotations

import functools

import jax
from flax import nnx

from jaxpaged.config import ModelConfig
from jaxpaged.model.decoder import DecoderModel, init_model
from jaxpaged.parallel.tensor_parallel import _KV_PROJ, ParamPath, TensorParallel


def param_dtype(model: DecoderModel):
    """The dtype the model's weights are stored in."""
    return model.embed_tokens.embedding.get_value().dtype


def logical_sharding(plan: TensorParallel, path: ParamPath, shape: tuple[int, ...]):
    """Where a loader puts a logical parameter: its final sharding, or replicated for k/v to be widened."""
    if plan.kv_replicas > 1 and len(path) >= 2 and path[-2] in _KV_PROJ:
        return plan.replicated  # small; widened to one head per device by `shard_model`
    return plan.param_sharding(path, shape)


def shard_model(model: DecoderModel, plan: TensorParallel) -> tuple[nnx.GraphDef, nnx.State]:
    """The sharded (physical) model as `(graphdef, state)`, ready for `nnx.merge` inside the step.

    Parameters already on the mesh with their final sharding (from a sharded
    loader or `init_sharded_model`) are kept as they are; k/v projections are
    widened on the devices when KV heads are replicated; anything else (a
    model built on one device or on the host) is cut into per-device slices
    through host memory.
    """
    dtype = param_dtype(model)
    physical = plan.physical_config
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: DecoderModel(physical, rngs=nnx.Rngs(0), dtype=dtype)))
    given = {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model))}
    flat = nnx.to_flat_state(abstract)
    for path, var in flat:
        shape = var.get_value().shape
        target = plan.param_sharding(path, shape)
        value = given[path]
        if isinstance(value, jax.Array) and value.shape == shape and value.sharding == target:
            var.set_value(value)
        elif isinstance(value, jax.Array) and value.shape != shape:  # k/v to widen: on the devices
            var.set_value(_widen_kv(value, plan.config.num_kv_heads, plan.kv_replicas, target))
        else:
            var.set_value(plan.place_params({path: value})[path])
    return graphdef, nnx.from_flat_state(flat)


def _widen_kv(kernel: jax.Array, num_kv_heads: int, replicas: int, sharding) -> jax.Array:
    @functools.partial(jax.jit, out_shardings=sharding)
    def widen(x):  # a kernel `[hidden, kv * d]` or a bias `[kv * d]`
        lead = x.shape[:-1]
        heads = x.reshape(*lead, num_kv_heads, -1)
        return jax.numpy.repeat(heads, replicas, axis=-2).reshape(*lead, -1)

    return widen(kernel)


def init_sharded_model(config: ModelConfig, plan: TensorParallel, seed: int = 0, dtype=None) -> DecoderModel:
    """Random weights from `seed` (the values `init_model` draws), generated straight into their shards.

    The initialiser runs under `jax.jit` with every parameter's output sharding,
    so no device materialises a full copy of a split weight.
    """
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: init_model(config, seed=seed, dtype=dtype)))
    flat = nnx.to_flat_state(abstract)
    shardings = [logical_sharding(plan, path, var.get_value().shape) for path, var in flat]

    def values():
        state = nnx.state(init_model(config, seed=seed, dtype=dtype))
        return [var.get_value() for _, var in nnx.to_flat_state(state)]

    for (_, var), value in zip(flat, jax.jit(values, out_shardings=shardings)()):
        var.set_value(value)
    return nnx.merge(graphdef, nnx.from_flat_state(flat))

