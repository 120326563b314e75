"""What a prefix-cache snapshot is valid for: the model, its weights, and the cache's layout.

K/V contents are only meaningful to the engine that computed them: the same
architecture and weights, the same block size (a block's tokens and hash depend
on it), the same KV dtype and fp8 scales, the same hash function (block
hashes are the cache's keys), and the same KV cache groups (which layers a
block id holds: with sliding-window layers a block belongs to one group). A snapshot records all of these, and restoring it
into an engine where any differs is refused with a ValueError naming the field.
"""

from __future__ import annotations

import hashlib
import json


import jax
import numpy as np

from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.config import ModelConfig
from jaxpaged.snapshot.parts import SnapshotParts

FORMAT_VERSION = 3  # 2: per-block digests, K/V rows keyed by block hash; 3: KV cache groups
_SAMPLE_ELEMENTS = 1 << 16


def params_fingerprint(params) -> str:
    """SHA-256 over every parameter's path, shape, dtype and (a strided sample of) its values.

    Leaves up to 65,536 elements are hashed whole; larger ones through 65,536
    evenly strided elements, so fingerprinting a 70B model moves a few MB, not
    its weights. Different seeds or checkpoints change every sample; a fine-tune
    touching only unsampled elements would not be noticed.
    """
    digest = hashlib.sha256()
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(params)[0],
                             key=lambda item: jax.tree_util.keystr(item[0])):
        flat = leaf.reshape(-1)
        if flat.size > _SAMPLE_ELEMENTS:
            flat = flat[:: flat.size // _SAMPLE_ELEMENTS][:_SAMPLE_ELEMENTS]
        values = np.asarray(jax.device_get(flat))
        digest.update(f"{jax.tree_util.keystr(path)}|{leaf.shape}|{leaf.dtype}|".encode())
        digest.update(values.tobytes())
    return digest.hexdigest()


def engine_identity(parts: SnapshotParts) -> dict:
    """The JSON-able record of everything a snapshot must match in the engine built from `parts`."""
    runner = parts.runner
    k_scale, v_scale = runner.kv_scales()
    return {
        "format_version": FORMAT_VERSION,
        "block_size": parts.block_size,
        "kv_cache_dtype": runner.kv_dtype.name,
        "hash_algo": parts.config.hash_algo,
        "model_config": json.loads(json.dumps(parts.model_config.to_dict())),  # as read back: tuples are lists
        "params_fingerprint": params_fingerprint(runner.params),
        "kv_scales": [k_scale.tolist(), v_scale.tolist()],
        "kv_cache_groups": kv_cache_groups(parts.model_config),
    }


def kv_cache_groups(model_config: ModelConfig) -> list:
    """The model's KV cache groups as ``[window, [layers...]]`` (one group of every layer without windows)."""
    return [[group.window, list(group.layers)] for group in kv_cache_layout(model_config.layer_windows).groups]


def check_identity(saved: dict, current: dict, where: str) -> None:
    """Raise ValueError naming the first field where snapshot `saved` differs from engine `current`."""
    for field in ("format_version", "block_size", "kv_cache_dtype", "hash_algo", "kv_cache_groups"):
        _require_equal(field, saved.get(field), current[field], where)
    saved_model, model = saved.get("model_config") or {}, current["model_config"]
    for key in sorted(set(saved_model) | set(model)):
        _require_equal(f"model_config.{key}", saved_model.get(key), model.get(key), where)
    _require_equal("params_fingerprint (model weights)", saved.get("params_fingerprint"),
                   current["params_fingerprint"], where)
    _require_equal("kv_scales", saved.get("kv_scales"), current["kv_scales"], where)


def _require_equal(field: str, saved, current, where: str) -> None:
    if saved != current:
        raise ValueError(f"prefix-cache snapshot {where} was made for a different engine: "
                         f"{field} differs (snapshot: {saved!r}, this engine: {current!r})")


def identity_digest(identity: dict) -> bytes:
    """32-byte digest of an identity record (the disk tier's format tag commits to it)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).digest()


def tie_disk_tier_to_identity(parts: SnapshotParts) -> None:
    """Tie the disk tier's files and the KV connector's transfers to the engine's identity (model, weights,
    layout, final fp8 scales); called once the identity is final (at build, or after fp8 calibration or a
    snapshot's scales were adopted)."""
    has_disk = parts.tiers is not None and parts.tiers.disk is not None
    if not has_disk and parts.kv_connector is None:
        return
    identity = identity_digest(engine_identity(parts))
    if has_disk:
        parts.tiers.set_format(identity)
    if parts.kv_connector is not None:
        parts.kv_connector.set_identity(identity)


def adopt_snapshot_kv_scales(runner, saved: dict, where: str) -> None:
    """Give an uncalibrated fp8 runner the snapshot's scales, so its blocks can be restored and reused.

    ValueError naming the file if the snapshot's scales do not fit this model.
    """
    from jaxpaged.kv_pool.fp8 import validate_kv_scales
    try:
        k_scale, v_scale = validate_kv_scales(runner.config, tuple(np.asarray(s, np.float32)
                                                                   for s in saved["kv_scales"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"prefix-cache snapshot {where} has unusable kv_scales: {err}") from None
    runner.set_kv_scales(k_scale, v_scale)
