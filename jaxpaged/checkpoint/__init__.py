"""Model weights in and out: Hugging Face safetensors, GGUF, Orbax, and the `load_model` dispatcher."""

from __future__ import annotations

import functools
from pathlib import Path

import jax.numpy as jnp

from jaxpaged.checkpoint.convert import convert_hf_to_orbax
from jaxpaged.checkpoint.gguf import check_gguf_checkpoint, is_gguf_file, load_gguf_checkpoint, read_gguf_config
from jaxpaged.checkpoint.hf import (hf_config_to_model_config, is_hf_checkpoint_dir,
                                    load_hf_checkpoint, read_hf_config, save_hf_checkpoint)
from jaxpaged.checkpoint.orbax_io import (is_orbax_checkpoint_dir, load_params, read_saved_config,
                                          save_params)
from jaxpaged.config import ModelConfig, load_config
from jaxpaged.model.decoder import DecoderModel, init_model
from jaxpaged.parallel import TensorParallel

__all__ = ["check_gguf_checkpoint", "convert_hf_to_orbax", "hf_config_to_model_config", "is_gguf_file",
           "is_hf_checkpoint_dir", "is_orbax_checkpoint_dir", "load_gguf_checkpoint", "load_hf_checkpoint", "load_model", "load_params",
           "model_config", "read_gguf_config", "save_hf_checkpoint", "save_params"]


def model_config(path_or_name: str | Path) -> ModelConfig:
    """The `ModelConfig` of what `load_model(path_or_name)` loads, without reading any weights: a checkpoint
    directory's own config (jaxpaged Orbax or Hugging Face), a GGUF file's metadata, else a shipped config name
    or a config JSON path."""
    path = Path(path_or_name)
    if is_gguf_file(path):
        return read_gguf_config(path)
    if not path.is_dir():
        return load_config(path_or_name)
    if is_orbax_checkpoint_dir(path):
        return read_saved_config(path)
    if is_hf_checkpoint_dir(path):
        return read_hf_config(path)
    raise ValueError(f"{path} is neither a jaxpaged Orbax checkpoint nor a Hugging Face "
                     f"checkpoint (config.json + safetensors)")


def load_model(path_or_name: str | Path, dtype=None, seed: int = 0, *,
               tensor_parallel_size: int = 1) -> DecoderModel:
    """The model `LLM(model=...)` names.

    - a jaxpaged Orbax directory (written by `save_params`): its weights;
    - a Hugging Face checkpoint directory: its weights, via `load_hf_checkpoint`;
    - a GGUF file: its weights dequantized, via `load_gguf_checkpoint`;
    - a shipped config name (`tiny`, `llama3-8b`, ...) or a config JSON path: random weights from `seed`.

    With `tensor_parallel_size` > 1 every weight is placed straight into its
    shards over that many devices (`jaxpaged.parallel`; ValueError if the model
    does not split that way), ready for `ModelRunner(tensor_parallel_size=...)`.
    """
    path = Path(path_or_name)
    config = model_config(path_or_name)
    if is_gguf_file(path):
        return load_gguf_checkpoint(path, dtype=dtype, sharding_of=_sharding_of(config, tensor_parallel_size))
    if path.is_dir():
        load = load_params if is_orbax_checkpoint_dir(path) else load_hf_checkpoint
        return load(path, dtype=dtype, sharding_of=_sharding_of(config, tensor_parallel_size))
    if dtype is not None:
        config = config.replace(dtype=jnp.dtype(dtype).name)
    if tensor_parallel_size > 1:
        from jaxpaged.parallel.placement import init_sharded_model
        return init_sharded_model(config, TensorParallel.create(config, tensor_parallel_size), seed, dtype)
    return init_model(config, seed=seed, dtype=dtype)


def _sharding_of(config, tensor_parallel_size: int):
    """Where a loader puts each logical weight under tensor parallelism (None: one device)."""
    if tensor_parallel_size <= 1:
        return None
    from jaxpaged.parallel.placement import logical_sharding
    plan = TensorParallel.create(config, tensor_parallel_size)
    return functools.partial(logical_sharding, plan)
