"""Read and write (optionally sharded) safetensors checkpoints with numpy arrays.

`safetensors.numpy` handles bfloat16 through `ml_dtypes`, so no framework
conversion is needed. Sharded checkpoints follow Hugging Face's layout:
`model-00001-of-0000N.safetensors` files and `model.safetensors.index.json`.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Mapping

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(checkpoint_dir: Path) -> dict[str, Path]:
    """Map each tensor name to the safetensors file holding it (reads headers only)."""
    index = checkpoint_dir / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        missing = sorted({f for f in weight_map.values() if not (checkpoint_dir / f).exists()})
        if missing:
            raise ValueError(f"{index} names shard files that do not exist: {missing}")
        return {name: checkpoint_dir / f for name, f in weight_map.items()}
    single = checkpoint_dir / SINGLE_FILE
    if not single.exists():
        raise ValueError(f"{checkpoint_dir} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    with safe_open(single, framework="numpy") as f:
        return {name: single for name in f.keys()}


class TensorReader(contextlib.AbstractContextManager):
    """Lazy access to tensors spread over several safetensors files; opens each file once."""

    def __init__(self, files: Mapping[str, Path]):
        self._files = dict(files)
        self._stack = contextlib.ExitStack()
        self._handles: dict[Path, object] = {}

    def _handle(self, name: str):
        path = self._files[name]
        if path not in self._handles:
            self._handles[path] = self._stack.enter_context(safe_open(path, framework="numpy"))
        return self._handles[path]

    def names(self) -> set[str]:
        """Every tensor name in the checkpoint."""
        return set(self._files)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor `name`, from the file header."""
        return tuple(self._handle(name).get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        """Load tensor `name` into memory."""
        return self._handle(name).get_tensor(name)

    def __exit__(self, *exc) -> None:
        self._stack.close()


def write_safetensors(tensors: Mapping[str, np.ndarray], out_dir: Path,
                      shard_size_bytes: int | None = None) -> list[Path]:
    """Write `tensors` (in order) as one file, or as shards of at most `shard_size_bytes` each.

    A tensor larger than the shard size gets a shard of its own. Returns the files written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "pt"}  # what transformers writes; some readers require it
    if shard_size_bytes is None:
        path = out_dir / SINGLE_FILE
        save_file(dict(tensors), path, metadata=metadata)
        return [path]
    shards = _pack(tensors, shard_size_bytes)
    weight_map, paths = {}, []
    for k, shard in enumerate(shards, start=1):
        path = out_dir / f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, path, metadata=metadata)
        weight_map.update({name: path.name for name in shard})
        paths.append(path)
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return paths


def _pack(tensors: Mapping[str, np.ndarray], shard_size_bytes: int) -> list[dict[str, np.ndarray]]:
    shards: list[dict[str, np.ndarray]] = [{}]
    used = 0
    for name, tensor in tensors.items():
        if shards[-1] and used + tensor.nbytes > shard_size_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += tensor.nbytes
    return shards

