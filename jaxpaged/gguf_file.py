"""A GGUF file (llama.cpp's checkpoint format) opened once: its metadata and its tensors, numpy only.

The parsing is the `gguf` package's (llama.cpp's own reader and dequantizers).
This module imports no JAX: the API server reads a GGUF's chat template here.
Opening a file parses every metadata entry (~4 s for a 49k-token vocabulary),
so `open_gguf` keeps the last few files it opened.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"


def is_gguf_file(path: str | Path) -> bool:
    """True when `path` is a file that starts with the GGUF magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


class GGUFFile:
    """The metadata and tensors of one GGUF file (tensors memory-mapped, read on access)."""

    def __init__(self, path: str | Path):
        """Parse `path`'s header; ValueError when it is not a GGUF file."""
        from gguf import GGUFReader

        self.path = Path(path)
        if not is_gguf_file(self.path):
            raise ValueError(f"{self.path} is not a GGUF file (no such file, or no GGUF magic bytes)")
        self._reader = GGUFReader(self.path)
        self._tensors = {t.name: t for t in self._reader.tensors}

    @property
    def architecture(self) -> str:
        """`general.architecture` (llama, qwen2, qwen3, gemma3, ...)."""
        return self.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        """The metadata value `key` (a number, a string, or a list of them); `default` when absent."""
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def has(self, key: str) -> bool:
        """Whether the metadata holds `key`."""
        return key in self._reader.fields

    def arch_get(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, e.g. `llama.block_count`."""
        return self.get(f"{self.architecture}.{key}", default)

    def tensor_names(self) -> list[str]:
        """Every tensor name, in file order."""
        return list(self._tensors)

    def tensor_type(self, name: str) -> str:
        """The ggml type name of tensor `name` (F32, Q4_K, ...)."""
        return self._tensors[name].tensor_type.name

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Tensor `name`'s shape in numpy order (a Linear weight is `[out, in]`, as in PyTorch)."""
        return tuple(int(d) for d in reversed(self._tensors[name].shape))

    def raw_tensor(self, name: str):
        """`(data, ggml type)` of tensor `name` as stored: quantized blocks stay packed."""
        tensor = self._tensors[name]
        return tensor.data, tensor.tensor_type


@functools.lru_cache(maxsize=4)
def _open_cached(path: str, mtime_ns: int, size: int) -> GGUFFile:
    return GGUFFile(path)


def open_gguf(path: str | Path) -> GGUFFile:
    """The parsed GGUF file at `path` (reused while the file is unchanged); ValueError if it is not one."""
    path = Path(path).resolve()
    if not is_gguf_file(path):
        raise ValueError(f"{path} is not a GGUF file (no such file, or no GGUF magic bytes)")
    stat = path.stat()
    return _open_cached(str(path), stat.st_mtime_ns, stat.st_size)
