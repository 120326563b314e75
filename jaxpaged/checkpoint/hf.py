"""Load and save Hugging Face checkpoints of every supported family (config.json + safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxpaged.checkpoint.hf_config import hf_config_to_model_config, model_config_to_hf_config
from jaxpaged.checkpoint.hf_names import TensorMapping, is_ignored, locate_language_model, tensor_mappings
from jaxpaged.checkpoint.safetensors_io import (INDEX_FILE, SINGLE_FILE, TensorReader,
                                                weight_files, write_safetensors)
from jaxpaged.checkpoint.skeleton import ShardingOf, abstract_params, assemble_model, model_params
from jaxpaged.config import ModelConfig
from jaxpaged.model.decoder import DecoderModel

__all__ = ["hf_config_to_model_config", "is_hf_checkpoint_dir", "load_hf_checkpoint",
           "read_hf_config", "save_hf_checkpoint"]


def is_hf_checkpoint_dir(path: str | Path) -> bool:
    """True when `path` is a directory with `config.json` and safetensors weights."""
    path = Path(path)
    return (path.is_dir() and (path / "config.json").is_file()
            and ((path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file()))


def read_hf_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of the HF checkpoint directory `path`, named after the directory."""
    path = Path(path)
    hf = json.loads((path / "config.json").read_text())
    return hf_config_to_model_config(hf, name=path.resolve().name)


def load_hf_checkpoint(path: str | Path, dtype=None, sharding_of: ShardingOf | None = None) -> DecoderModel:
    """Load a Hugging Face checkpoint directory (any supported `model_type`) into a `DecoderModel`.

    `dtype` (e.g. "bfloat16") overrides the checkpoint's `torch_dtype`; weights
    are cast to it. Raises `ValueError` naming any missing, unexpected or
    mis-shaped tensor before loading any weight data. `sharding_of` places
    each weight's slices straight on their devices (tensor parallelism).
    """
    path = Path(path)
    if not is_hf_checkpoint_dir(path):
        raise ValueError(f"{path} is not a Hugging Face checkpoint (config.json + {SINGLE_FILE} "
                         f"or {INDEX_FILE})")
    config = read_hf_config(path)
    dtype = dtype or config.dtype
    expected = abstract_params(config, dtype)
    with TensorReader(weight_files(path)) as reader:
        mappings, multimodal = locate_language_model(tensor_mappings(config), reader.names())
        _check_tensors(path, config, mappings, expected, reader, multimodal)
        params = {m.path: _to_flax(reader.get(m.hf_name), m) for m in mappings}
    return assemble_model(config, params, dtype, sharding_of)


def save_hf_checkpoint(model: DecoderModel, path: str | Path, *,
                       shard_size_bytes: int | None = None) -> None:
    """Write `model` as a Hugging Face checkpoint of its `model_type` (HF names, `[out, in]` Linear weights).

    With `shard_size_bytes`, weights are split over several files plus
    `model.safetensors.index.json`, as transformers does for large models.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    params = model_params(model)
    dtype = next(iter(params.values())).dtype
    config = model.config.replace(dtype=np.dtype(dtype).name)
    tensors = {m.hf_name: _to_flax(np.asarray(params[m.path]), m) for m in tensor_mappings(config)}
    write_safetensors(tensors, path, shard_size_bytes)
    (path / "config.json").write_text(json.dumps(model_config_to_hf_config(config), indent=2))


def _to_flax(tensor: np.ndarray, mapping: TensorMapping) -> np.ndarray:
    """HF layout to Flax layout; its own inverse (a transpose, or nothing)."""
    return np.ascontiguousarray(tensor.T) if mapping.transpose else tensor


def _check_tensors(path: Path, config: ModelConfig, mappings: list[TensorMapping],
                   expected: dict, reader: TensorReader, multimodal: bool = False) -> None:
    """Raise `ValueError` unless the checkpoint holds exactly the tensors `config` needs
    (beside a vision tower, in a `multimodal` checkpoint)."""
    present = reader.names()
    wanted = {m.hf_name for m in mappings}
    missing = sorted(wanted - present)
    if missing:
        raise ValueError(f"checkpoint {path} is missing tensors: {missing}")
    unexpected = sorted(n for n in present - wanted if not is_ignored(n, config, multimodal))
    if unexpected:
        raise ValueError(f"checkpoint {path} has unexpected tensors: {unexpected}")
    for m in mappings:
        want = expected[m.path].shape
        want = tuple(reversed(want)) if m.transpose else tuple(want)
        got = reader.shape(m.hf_name)
        if got != want:
            raise ValueError(f"tensor {m.hf_name!r} in {path} has shape {got}, expected {want}")
