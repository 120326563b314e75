"""The on-disk form of a prefix-cache snapshot.

A snapshot is a directory::

    prefix_cache.json   identity (see identity.py), the number of K/V rows, and one record per
                        block, coldest first: hash, parent hash (hex), token ids, extra keys, tier,
                        KV cache group, and the SHA-256 of the block's K/V bytes
    kv/                 Orbax StandardCheckpointer output: {"k": [layer...], "v": [layer...], "hashes"},
                        each layer [num_kv_heads, num_rows, block_size, head_dim] ("layer": pool tensor);
                        "hashes" [num_rows, hash_len + 2] uint8 names the block in each row, as its hash
                        and its KV cache group (little-endian uint16; absent when there are no blocks)

A record finds its K/V row by its block hash, never by position, and a row
whose bytes do not match the record's digest is not used: a reordered, deleted
or edited record or a flipped byte in the K/V data is a skipped block, never a
wrong one. A snapshot whose files cannot be read or parsed is a ValueError
naming the file.

It is written to a sibling temporary directory and renamed into place, so a
crash mid-save leaves the previous snapshot intact; a failed save removes its
temporary directory, and the next save removes those of saves whose process died.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

META_FILE = "prefix_cache.json"
KV_DIR = "kv"


@dataclasses.dataclass(frozen=True)
class BlockRecord:
    """One cached block: its hash, the hash's inputs, where its K/V lived ("device" pool), and its group.

    ``group`` is the KV cache group whose layers the block holds (0 without
    sliding-window layers); a cache keys the block by hash and group.
    """

    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    extra_keys: tuple = ()
    tier: str = "device"
    digest: bytes = b""  # SHA-256 of the block's K/V bytes ([2, L, Hkv, B, D], C order)
    group: int = 0

    @property
    def row_key(self) -> bytes:
        """The name of the block's K/V row: its hash, then its group as two little-endian bytes."""
        return self.block_hash + self.group.to_bytes(2, "little")

    def to_json(self) -> dict:
        return {"hash": self.block_hash.hex(),
                "parent": None if self.parent_hash is None else self.parent_hash.hex(),
                "tokens": list(self.token_ids), "extra_keys": _encode_keys(self.extra_keys),
                "tier": self.tier, "digest": self.digest.hex(), "group": self.group}

    @classmethod
    def from_json(cls, d: dict) -> "BlockRecord":
        if d["tier"] not in ("device", "host"):
            raise ValueError(f"unknown tier {d['tier']!r}")
        return cls(bytes.fromhex(d["hash"]), None if d["parent"] is None else bytes.fromhex(d["parent"]),
                   tuple(int(t) for t in d["tokens"]), _decode_keys(d["extra_keys"]), d["tier"],
                   bytes.fromhex(d["digest"]), int(d.get("group", 0)))  # format 2 had no groups


def block_digest(block: np.ndarray) -> bytes:
    """SHA-256 of one block's K/V bytes (the runner's `[2, L, Hkv, B, D]` layout)."""
    return hashlib.sha256(np.ascontiguousarray(block).tobytes()).digest()


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
    """Write a snapshot directory at `path`, replacing an earlier snapshot there (never other data).

    Row i of `kv` holds record i's block; the rows are stored under their hashes.
    A save that fails removes its temporary directory (the earlier snapshot
    stays); temporary directories of saves whose process died are removed first.
    """
    path = Path(path).absolute()  # Orbax requires absolute paths
    if path.exists() and not is_snapshot_dir(path):
        raise ValueError(f"{path} exists and is not a prefix-cache snapshot; refusing to overwrite it")
    remove_dead_saves(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        if records:
            hashes = np.frombuffer(b"".join(r.row_key for r in records), np.uint8).reshape(len(records), -1)
            with ocp.StandardCheckpointer() as checkpointer:
                checkpointer.save(tmp / KV_DIR, {**kv, "hashes": hashes})
                checkpointer.wait_until_finished()
        meta = {"identity": identity, "num_rows": len(records), "blocks": [r.to_json() for r in records]}
        (tmp / META_FILE).write_text(json.dumps(meta))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def remove_dead_saves(path: Path) -> list[Path]:
    """Remove the temporary directories that saves to `path` left when their process died; returns them.

    A save writes `<name>.tmp-<pid>-<random>` beside `path`; one whose pid no
    longer runs on this machine is garbage (a live process's save is kept).
    """
    removed = []
    for tmp in path.parent.glob(f"{path.name}.tmp-*-*"):
        pid = tmp.name[len(path.name) + len(".tmp-"):].split("-", 1)[0]
        if tmp.is_dir() and pid.isdigit() and not _process_runs(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def read_meta(path: str | Path) -> tuple[dict, int, list[BlockRecord]]:
    """The identity, K/V row count and block records of the snapshot at `path` (K/V not read).

    ValueError naming the file if it is missing, unreadable or malformed.
    """
    if not is_snapshot_dir(path):
        raise ValueError(f"{path} is not a prefix-cache snapshot (no {META_FILE})")
    file = Path(path) / META_FILE
    try:
        meta = json.loads(file.read_text())
        identity, num_rows = meta["identity"], int(meta["num_rows"])
        records = [BlockRecord.from_json(d) for d in meta["blocks"]]
        if not isinstance(identity, dict) or num_rows < 0:
            raise ValueError("identity must be an object and num_rows non-negative")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError,
            AttributeError) as err:
        raise ValueError(f"prefix-cache snapshot file {file} is corrupt or unreadable: "
                         f"{type(err).__name__}: {err}") from None
    return identity, num_rows, records


def read_kv(path: str | Path, num_rows: int, hash_len: int, block_shape: tuple[int, ...],
            dtype) -> tuple[dict[str, list[np.ndarray]], dict[bytes, int]]:
    """The snapshot's K/V arrays and the row of each row key (``BlockRecord.row_key``, ``hash_len`` bytes).

    Arrays are per layer `[num_kv_heads, num_rows, block_size, head_dim]` of
    `dtype`; `block_shape` is one block's `(2, num_layers, num_kv_heads,
    block_size, head_dim)` (layers: the pool's tensors). ValueError naming the directory if it cannot be read.
    """
    _, num_layers, heads, block_size, head_dim = block_shape
    layer = jax.ShapeDtypeStruct((heads, num_rows, block_size, head_dim), dtype)
    target = {"k": [layer] * num_layers, "v": [layer] * num_layers,
              "hashes": jax.ShapeDtypeStruct((num_rows, hash_len), np.uint8)}
    where = Path(path).absolute() / KV_DIR
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            kv = checkpointer.restore(where, target)
    except Exception as err:  # Orbax/TensorStore raise many types for missing or damaged files
        raise ValueError(f"prefix-cache snapshot K/V data {where} is corrupt or unreadable: "
                         f"{type(err).__name__}: {str(err)[:300]}") from None
    rows = {np.asarray(h).tobytes(): i for i, h in enumerate(np.asarray(kv.pop("hashes")))}
    return kv, rows
