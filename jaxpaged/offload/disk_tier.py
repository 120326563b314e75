"""The optional disk tier: one file per KV block in a directory, LRU, bounded in bytes.

File layout (little-endian)::

    magic b"JPKVBLK1" | format tag (32) | key length (u8) | key | payload sha256 (32) | payload

The format tag commits to the pool's dtype, block shape and fp8 scales, so a
block written under other scales or another model is a miss. On load the key
and the payload digest are checked; a missing, truncated or corrupt file is a
miss (and is deleted), never wrong data. Files survive the process: block
hashes are deterministic, so a later engine with the same format reuses them.
"""

from __future__ import annotations

import collections
import hashlib
import os
from pathlib import Path

import numpy as np

_MAGIC = b"JPKVBLK1"
_SUFFIX = ".kvblk"


def format_tag(dtype: np.dtype, block_shape: tuple[int, ...], scales: bytes) -> bytes:
    """32-byte digest of everything a block's bytes depend on besides its tokens."""
    text = f"{np.dtype(dtype).name}|{tuple(block_shape)}|".encode()
    return hashlib.sha256(text + scales).digest()


class DiskKVCache:
    """Block files under ``directory``, at most ``capacity_bytes`` of them, least recently used deleted first."""

    def __init__(self, directory: str | os.PathLike, capacity_bytes: int, block_bytes: int,
                 dtype: np.dtype, block_shape: tuple[int, ...]) -> None:
        if capacity_bytes < block_bytes:
            raise ValueError(f"disk_cache_bytes={capacity_bytes} is smaller than one KV block "
                             f"({block_bytes} bytes)")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self.dtype = np.dtype(dtype)
        self.block_shape = tuple(block_shape)
        self.tag: bytes | None = None  # unset (e.g. before fp8 calibration): every lookup misses
        self.num_corrupt = 0
        self._sizes: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.used_bytes = 0  # bytes of the block files indexed
        files = sorted(self.directory.glob(f"*{_SUFFIX}"), key=lambda p: p.stat().st_mtime)
        for path in files:  # oldest first: the LRU order survives a restart
            try:
                self._add(bytes.fromhex(path.stem), path.stat().st_size)
            except ValueError:
                continue  # not one of ours
        self._shrink()

    def __len__(self) -> int:
        return len(self._sizes)

    def _path(self, block_hash: bytes) -> Path:
        return self.directory / f"{block_hash.hex()}{_SUFFIX}"

    def store(self, block_hash: bytes, data: np.ndarray) -> None:
        """Write one block (atomically: temp file then rename), evicting old files beyond capacity."""
        if self.tag is None or block_hash in self._sizes:
            return
        payload = np.ascontiguousarray(data, self.dtype).tobytes()
        blob = b"".join([_MAGIC, self.tag, bytes([len(block_hash)]), block_hash,
                         hashlib.sha256(payload).digest(), payload])
        path = self._path(block_hash)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)
        self._add(block_hash, len(blob))
        self._shrink()

    def load(self, block_hash: bytes) -> np.ndarray | None:
        """The block's data if its file exists and checks out; otherwise None (a bad file is deleted)."""
        if self.tag is None or block_hash not in self._sizes:
            return None
        try:
            blob = self._path(block_hash).read_bytes()
        except OSError:
            blob = b""
        data = self._parse(block_hash, blob)
        if data is None:
            self.num_corrupt += 1
            self._drop(block_hash)
            return None
        self._sizes.move_to_end(block_hash)
        return data

    def _parse(self, block_hash: bytes, blob: bytes) -> np.ndarray | None:
        head = len(_MAGIC) + 32
        if blob[:len(_MAGIC)] != _MAGIC or blob[len(_MAGIC):head] != self.tag or len(blob) <= head:
            return None
        key_len = blob[head]
        key_end = head + 1 + key_len
        if blob[head + 1:key_end] != block_hash:
            return None
        digest, payload = blob[key_end:key_end + 32], blob[key_end + 32:]
        expected = int(np.prod(self.block_shape)) * self.dtype.itemsize
        if len(payload) != expected or hashlib.sha256(payload).digest() != digest:
            return None
        return np.frombuffer(payload, self.dtype).reshape(self.block_shape).copy()

    def _add(self, block_hash: bytes, size: int) -> None:
        self._sizes[block_hash] = size
        self.used_bytes += size

    def _drop(self, block_hash: bytes) -> None:
        self.used_bytes -= self._sizes.pop(block_hash, 0)
        self._path(block_hash).unlink(missing_ok=True)

    def _shrink(self) -> None:
        while self.used_bytes > self.capacity_bytes and self._sizes:
            self._drop(next(iter(self._sizes)))
