"""KV blocks on the wire: a header naming what they are, and one payload of raw bytes.

The header carries the sender's engine identity digest (model config, weights
fingerprint, block size, KV dtype and fp8 scales, hash function, KV cache
groups: ``jaxpaged.snapshot.identity``), the pool dtype, one block's shape, the
keys (``group_key(block hash, group)``) in payload order, and the SHA-256 of
the payload. :meth:`KVBlockBatch.check` on the receiving side refuses any
difference, and a payload of the wrong length or digest: a mismatched or
partial transfer is never served.
"""

from __future__ import annotations

import hashlib

import msgspec
import numpy as np


class KVTransferRefused(ValueError):
    """Received blocks that this engine must not use (another model, layout or dtype, or a damaged payload)."""


class KVBlockHeader(msgspec.Struct, array_like=True):
    """What a payload holds: see the module docstring."""

    identity: bytes
    dtype: str
    block_shape: list[int]
    keys: list[bytes]
    digest: bytes


class KVBlockBatch:
    """Blocks ready to send (``from_blocks``) or received (``check`` then ``blocks``)."""

    def __init__(self, header: KVBlockHeader, payload: bytes | memoryview | np.ndarray):
        self.header = header
        self.payload = payload

    @classmethod
    def from_blocks(cls, identity: bytes, keys: list[bytes], blocks: list[np.ndarray],
                    dtype: np.dtype, block_shape: tuple[int, ...]) -> "KVBlockBatch":
        """Pack ``blocks`` (one array of ``block_shape`` in ``dtype`` each, in ``keys`` order)."""
        stacked = (np.stack(blocks).astype(dtype, copy=False) if blocks
                   else np.zeros((0, *block_shape), dtype))
        payload = np.ascontiguousarray(stacked)
        header = KVBlockHeader(identity, np.dtype(dtype).name, list(block_shape), list(keys),
                               hashlib.sha256(payload.data).digest())
        return cls(header, payload)

    @property
    def num_bytes(self) -> int:
        """Payload size."""
        return memoryview(self.payload).nbytes

    def check(self, identity: bytes | None, dtype: np.dtype, block_shape: tuple[int, ...]) -> None:
        """Raise :class:`KVTransferRefused` naming what differs from this engine's pool, or a damaged payload."""
        h = self.header
        if identity is None:
            raise KVTransferRefused("this engine's identity is not fixed yet (fp8 scales uncalibrated)")
        if h.identity != identity:
            raise KVTransferRefused("the sender is a different engine: model config, weights, block size, "
                                    "KV dtype, fp8 scales, hash function or KV cache groups differ")
        if h.dtype != np.dtype(dtype).name:
            raise KVTransferRefused(f"KV dtype differs: sent {h.dtype}, this pool {np.dtype(dtype).name}")
        if tuple(h.block_shape) != tuple(block_shape):
            raise KVTransferRefused(f"block shape differs: sent {tuple(h.block_shape)}, "
                                    f"this pool {tuple(block_shape)}")
        expected = len(h.keys) * int(np.prod(block_shape)) * np.dtype(dtype).itemsize
        if self.num_bytes != expected:
            raise KVTransferRefused(f"payload is {self.num_bytes} bytes, {len(h.keys)} blocks need {expected}")
        if hashlib.sha256(memoryview(self.payload).cast("B")).digest() != h.digest:
            raise KVTransferRefused("payload digest differs: the blocks were damaged in transit")

    def blocks(self, dtype: np.dtype) -> list[tuple[bytes, np.ndarray]]:
        """``(key, block)`` pairs (call :meth:`check` first)."""
        shape = (len(self.header.keys), *self.header.block_shape)
        array = np.frombuffer(memoryview(self.payload).cast("B"), dtype=dtype).reshape(shape)
        return list(zip(self.header.keys, array))


def encode_header(header: KVBlockHeader) -> bytes:
    """MessagePack bytes of a header."""
    return msgspec.msgpack.encode(header)


def decode_header(data: bytes) -> KVBlockHeader:
    """A header back from :func:`encode_header`; ``KVTransferRefused`` if it is not one."""
    try:
        return msgspec.msgpack.decode(data, type=KVBlockHeader)
    except msgspec.DecodeError as err:
        raise KVTransferRefused(f"not a KV block header: {err}") from None
