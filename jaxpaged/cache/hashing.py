"""Content-addressed hashing of KV-cache blocks.

A full block's hash commits to its whole prefix::

    h_i = H(h_{i-1} || tokens_i || extras_i || len(extras_i))

Canonical byte encoding (version 1), identical on every process and machine:

* ``h_{i-1}``: the parent block's digest. Block 0 has no parent and uses
  ``ROOT = H(b"jaxpaged.kv_pool-block-hash.v1")`` instead, so every parent field has
  the algorithm's digest size (32 bytes for SHA-256, 16 for xxh3-128).
* ``tokens_i``: the block's token ids, each a little-endian signed int64.
* ``extras_i``: the block's extra keys, each encoded as a one-byte tag, a
  little-endian uint64 payload length and the payload: ``s`` + UTF-8 for
  ``str``, ``b`` + raw bytes for ``bytes``, ``i`` + ASCII decimal for ``int``,
  ``t`` + the concatenated encodings of its items for ``tuple``.
* ``len(extras_i)``: little-endian uint64 byte length of ``extras_i``.

Because the parent has a fixed size and the message ends with the length of
the extras, the encoding can be parsed back unambiguously; a block without
extra keys is just ``parent || tokens || 8 zero bytes``.

Request-level keys (the per-tenant ``cache_salt`` and any ``extra_keys`` such
as an adapter id) go into block 0 only: since every later hash chains through
``h_0``, two requests whose keys differ never share any block. When a salt is
given, block 0's extra keys are ``(("cache_salt", salt), *extra_keys)``.

``H`` is SHA-256 by default, or xxh3-128 (``xxhash`` package) for speed. Python's
``hash()`` and pickle are never used: both differ across processes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

HASH_ALGOS = ("sha256", "xxh3_128")
_ROOT_MESSAGE = b"jaxpaged.kv_pool-block-hash.v1"
_U64 = struct.Struct("<Q")


@cache
def digest_fn(hash_algo: str) -> Callable[[bytes], bytes]:
    """Returns the one-shot ``bytes -> digest`` function for ``hash_algo``."""
    if hash_algo == "sha256":
        sha256 = hashlib.sha256
        return lambda data: sha256(data).digest()
    if hash_algo == "xxh3_128":
        import xxhash  # imported lazily: only this option needs the package

        return xxhash.xxh3_128_digest
    raise ValueError(f"hash_algo must be one of {HASH_ALGOS}, got {hash_algo!r}")


@cache
def root_hash(hash_algo: str) -> bytes:
    """The stand-in parent hash of block 0 for ``hash_algo``."""
    return digest_fn(hash_algo)(_ROOT_MESSAGE)


def request_extra_keys(cache_salt: str | None, extra_keys: tuple = ()) -> tuple:
    """Block 0's extra keys for a request: its salt (if any) then ``extra_keys``."""
    if cache_salt is None:
        return tuple(extra_keys)
    return (("cache_salt", cache_salt),) + tuple(extra_keys)


def encode_extra_keys(extra_keys: tuple) -> bytes:
    """Canonical encoding of extra keys, ending with its own uint64 length."""
    blob = b"".join(_encode_key(key) for key in extra_keys)
    return blob + _U64.pack(len(blob))


def _encode_key(key: object) -> bytes:
    if isinstance(key, str):
        tag, payload = b"s", key.encode("utf-8")
    elif isinstance(key, bytes):
        tag, payload = b"b", key
    elif isinstance(key, int):
        tag, payload = b"i", str(int(key)).encode("ascii")
    elif isinstance(key, tuple):
        tag, payload = b"t", b"".join(_encode_key(item) for item in key)
    else:
        raise ValueError(
            f"extra key {key!r} has type {type(key).__name__}; "
            "allowed types are str, bytes, int and tuples of them"
        )
    return tag + _U64.pack(len(payload)) + payload


def _pack_tokens(fmt: str, token_ids: Sequence[int]) -> bytes:
    """``struct.pack`` that reports bad token ids as ValueError."""
    try:
        return struct.pack(fmt, *token_ids)
    except struct.error as err:
        raise ValueError(f"token ids must be integers in the int64 range: {err}") from None


def _encode_full_blocks(token_ids: Sequence[int], block_size: int, num_blocks: int) -> bytes:
    """Every block's ``tokens || u64(0)`` (the no-extra-keys tail), back to back."""
    if isinstance(token_ids, np.ndarray):
        if not np.issubdtype(token_ids.dtype, np.integer):
            raise ValueError(f"token ids must be integers, got dtype {token_ids.dtype}")
        rows = np.zeros((num_blocks, block_size + 1), dtype="<i8")
        rows[:, :block_size] = token_ids[: num_blocks * block_size].reshape(num_blocks, block_size)
        return rows.tobytes()
    num_tokens = num_blocks * block_size
    body = token_ids if len(token_ids) == num_tokens else token_ids[:num_tokens]
    return _pack_tokens("<" + f"{block_size}q8x" * num_blocks, body)


def _check_parent(parent_hash: bytes | None, hash_algo: str) -> bytes:
    root = root_hash(hash_algo)
    if parent_hash is None:
        return root
    if not isinstance(parent_hash, bytes) or len(parent_hash) != len(root):
        raise ValueError(
            f"parent_hash must be None or {len(root)} bytes for {hash_algo}, got {parent_hash!r}"
        )
    return parent_hash


def hash_block_tokens(
    parent_hash: bytes | None,
    token_ids: Sequence[int],
    extra_keys: tuple = (),
    *,
    hash_algo: str = "sha256",
) -> bytes:
    """Hash of one block: ``H(parent || tokens || extras || len(extras))``.

    ``parent_hash`` is the previous block's hash, or None for the first block.
    """
    parent = _check_parent(parent_hash, hash_algo)
    digest = digest_fn(hash_algo)
    tokens = _pack_tokens(f"<{len(token_ids)}q", token_ids)
    return digest(parent + tokens + encode_extra_keys(tuple(extra_keys)))


def chain_block_hashes(
    parent_hash: bytes | None,
    token_ids: Sequence[int],
    block_size: int,
    first_extra_keys: tuple = (),
    hash_algo: str = "sha256",
) -> list[bytes]:
    """Chained hashes of the full blocks of ``token_ids``, starting after ``parent_hash``.

    ``first_extra_keys`` are mixed into the first block hashed here; later blocks
    have none. Equal to folding :func:`hash_block_tokens` over the blocks, but all
    tokens are encoded in one call, which is most of the saving.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    digest = digest_fn(hash_algo)
    parent = _check_parent(parent_hash, hash_algo)
    num_full = len(token_ids) // block_size
    if num_full == 0:
        return []
    payload = _encode_full_blocks(token_ids, block_size, num_full)
    token_bytes = 8 * block_size
    stride = token_bytes + 8
    hashes: list[bytes] = []
    start = 0
    if first_extra_keys:
        parent = digest(parent + payload[:token_bytes] + encode_extra_keys(tuple(first_extra_keys)))
        hashes.append(parent)
        start = stride
    append = hashes.append
    for offset in range(start, len(payload), stride):
        parent = digest(parent + payload[offset : offset + stride])
        append(parent)
    return hashes


@cache
def next_block_hasher(block_size: int, hash_algo: str) -> Callable[[bytes, Sequence[int]], bytes]:
    """``hash_next(parent_hash, block_tokens)``: the hash of one full block without extra keys.

    Equal to ``chain_block_hashes(parent_hash, block_tokens, block_size, (), hash_algo)[0]``
    for a ``parent_hash`` the caller computed itself (it is not checked): the
    per-block step of decoding, where a generated block fills and is published.
    """
    digest = digest_fn(hash_algo)
    pack = struct.Struct(f"<{block_size}q8x").pack  # tokens, then the empty extras' u64 length

    def hash_next(parent_hash: bytes, block_tokens: Sequence[int]) -> bytes:
        try:
            return digest(parent_hash + pack(*block_tokens))
        except struct.error as err:
            raise ValueError(f"block of {block_size} token ids expected, int64 each: {err}") from None

    return hash_next


def hash_request_blocks(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
    extra_keys: tuple = (),
    hash_algo: str = "sha256",
) -> list[bytes]:
    """Chained hashes of every full block of a request (a partial last block is skipped)."""
    return chain_block_hashes(
        None, token_ids, block_size, request_extra_keys(cache_salt, extra_keys), hash_algo
    )
