"""Model weights in and out: Hugging Face safetensors, Orbax, and the `load_model` dispatcher."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp

from jaxpaged.checkpoint.convert import convert_hf_to_orbax
from jaxpaged.checkpoint.hf import (hf_config_to_model_config, is_hf_checkpoint_dir,
                                    load_hf_checkpoint, save_hf_checkpoint)
from jaxpaged.checkpoint.orbax_io import is_orbax_checkpoint_dir, load_params, save_params
from jaxpaged.config import load_config
from jaxpaged.model.llama import LlamaModel, init_model

__all__ = ["convert_hf_to_orbax", "hf_config_to_model_config", "is_hf_checkpoint_dir",
           "is_orbax_checkpoint_dir", "load_hf_checkpoint", "load_model", "load_params",
           "save_hf_checkpoint", "save_params"]


def load_model(path_or_name: str | Path, dtype=None, seed: int = 0) -> LlamaModel:
    """The model `LLM(model=...)` names.

    - a jaxpaged Orbax directory (written by `save_params`): its weights;
    - a Hugging Face checkpoint directory: its weights, via `load_hf_checkpoint`;
    - a shipped config name (`tiny`, `llama3-8b`, ...) or a config JSON path: random weights from `seed`.
    """
    path = Path(path_or_name)
    if path.is_dir():
        if is_orbax_checkpoint_dir(path):
            return load_params(path, dtype=dtype)
        if is_hf_checkpoint_dir(path):
            return load_hf_checkpoint(path, dtype=dtype)
        raise ValueError(f"{path} is neither a jaxpaged Orbax checkpoint nor a Hugging Face "
                         f"checkpoint (config.json + safetensors)")
    config = load_config(path_or_name)
    if dtype is not None:
        config = config.replace(dtype=jnp.dtype(dtype).name)
    return init_model(config, seed=seed, dtype=dtype)
