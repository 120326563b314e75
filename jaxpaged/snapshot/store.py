"""The on-disk form of a prefix-cache snapshot.

A snapshot is a directory::

    prefix_cache.json   identity (see identity.py) + one record per block, coldest first:
                        hash, parent hash (hex), token ids, extra keys, tier
    kv/                 Orbax StandardCheckpointer output: {"k": [layer...], "v": [layer...]},
                        each [num_kv_heads, num_snapshot_blocks, block_size, head_dim],
                        block i of the arrays is record i (absent when there are no blocks)

It is written to a sibling temporary directory and renamed into place, so a
crash mid-save leaves the previous snapshot intact.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

META_FILE = "prefix_cache.json"
KV_DIR = "kv"


@dataclasses.dataclass(frozen=True)
class BlockRecord:
    """One cached block: its hash, the hash's inputs, and where its K/V lived ("device" pool)."""

    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    extra_keys: tuple = ()
    tier: str = "device"

    def to_json(self) -> dict:
        return {"hash": self.block_hash.hex(),
                "parent": None if self.parent_hash is None else self.parent_hash.hex(),
                "tokens": list(self.token_ids), "extra_keys": _encode_keys(self.extra_keys),
                "tier": self.tier}

    @classmethod
    def from_json(cls, d: dict) -> "BlockRecord":
        return cls(bytes.fromhex(d["hash"]), None if d["parent"] is None else bytes.fromhex(d["parent"]),
                   tuple(int(t) for t in d["tokens"]), _decode_keys(d["extra_keys"]), d.get("tier", "device"))


def _encode_keys(keys: tuple) -> list:
    """Extra keys (str / bytes / int / nested tuples) as tagged JSON, so they round-trip exactly."""
    out = []
    for key in keys:
        if isinstance(key, tuple):
            out.append({"t": _encode_keys(key)})
        elif isinstance(key, bytes):
            out.append({"b": key.hex()})
        elif isinstance(key, (str, int)):
            out.append({"s" if isinstance(key, str) else "i": key})
        else:
            raise ValueError(f"extra key {key!r} of type {type(key).__name__} cannot be snapshotted")
    return out


def _decode_keys(items: list) -> tuple:
    decoders = {"t": _decode_keys, "b": bytes.fromhex, "s": str, "i": int}
    return tuple(decoders[tag](value) for item in items for tag, value in item.items())


def is_snapshot_dir(path: str | Path) -> bool:
    """True when `path` holds a prefix-cache snapshot."""
    return (Path(path) / META_FILE).is_file()


def write_snapshot(path: str | Path, identity: dict, records: list[BlockRecord],
                   kv: dict[str, list[np.ndarray]] | None) -> None:
    """Write a snapshot directory at `path`, replacing an earlier snapshot there (never other data)."""
    path = Path(path).absolute()  # Orbax requires absolute paths
    if path.exists() and not is_snapshot_dir(path):
        raise ValueError(f"{path} exists and is not a prefix-cache snapshot; refusing to overwrite it")
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if records:
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(tmp / KV_DIR, kv)
            checkpointer.wait_until_finished()
    meta = {"identity": identity, "blocks": [r.to_json() for r in records]}
    (tmp / META_FILE).write_text(json.dumps(meta))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def read_meta(path: str | Path) -> tuple[dict, list[BlockRecord]]:
    """The identity and block records of the snapshot at `path` (K/V not read)."""
    if not is_snapshot_dir(path):
        raise ValueError(f"{path} is not a prefix-cache snapshot (no {META_FILE})")
    meta = json.loads((Path(path) / META_FILE).read_text())
    return meta["identity"], [BlockRecord.from_json(d) for d in meta["blocks"]]


def read_kv(path: str | Path, num_blocks: int, block_shape: tuple[int, ...],
            dtype) -> dict[str, list[np.ndarray]]:
    """The snapshot's K/V arrays: per layer `[num_kv_heads, num_blocks, block_size, head_dim]` of `dtype`.

    `block_shape` is one block's `(2, num_layers, num_kv_heads, block_size, head_dim)`.
    """
    _, num_layers, heads, block_size, head_dim = block_shape
    layer = jax.ShapeDtypeStruct((heads, num_blocks, block_size, head_dim), dtype)
    target = {"k": [layer] * num_layers, "v": [layer] * num_layers}
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(Path(path).absolute() / KV_DIR, target)
