"""FP8 (float8_e4m3fn) KV cache: per-layer, per-KV-head float32 scales and their calibration.

Stored value = ``clip(x / scale, -448, 448)`` cast to float8_e4m3fn; read value =
``stored * scale`` (`jaxpaged.kv_pool.pool.write_layer_kv` and the attention
backends). The scales are pool data, not compile-time constants, so setting
them never recompiles a step.

Calibration (when no scales are given; `jaxpaged.runner.calibrate_kv_scales`):
the first prefill is run once through a small float32 pool; the absolute
maximum of K and V per layer and KV head over its tokens gives
``scale = absmax * margin / 448``. ``margin > 1`` leaves headroom for later
tokens whose K/V exceed the calibration prompt's; anything beyond it saturates
at ±448 instead of overflowing to NaN. E4M3 keeps 3 mantissa bits over its
whole normal range, so headroom costs precision only for values below
``absmax * margin * 2**-6 / 448``, which become subnormal.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from jaxpaged.config import ModelConfig
from jaxpaged.kv_pool.pool import FP8_MAX, KVPool

DEFAULT_SCALE_MARGIN = 2.0
_MIN_SCALE = 1e-6  # a head whose calibration K/V were all zero still gets a usable scale


def validate_kv_scales(config: ModelConfig, kv_scales) -> tuple[np.ndarray, np.ndarray]:
    """Check user-given ``(k_scale, v_scale)`` and return them as float32 ``[num_layers, num_kv_heads]``.

    Raises:
      ValueError: not a pair, wrong shape, or a scale that is not finite and positive.
    """
    shape = (config.num_layers, config.num_kv_heads)
    try:
        k_scale, v_scale = kv_scales
    except (TypeError, ValueError):
        raise ValueError(f"kv_scales must be a pair (k_scale, v_scale) of shape {shape} each") from None
    out = []
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        arr = np.asarray(scale, np.float32)
        if arr.shape != shape:
            raise ValueError(f"kv_scales {name} must have shape {shape} (layers, kv heads), got {arr.shape}")
        if not np.all(np.isfinite(arr) & (arr > 0)):
            raise ValueError(f"kv_scales {name} must be finite and > 0, got min {arr.min()}")
        out.append(arr)
    return out[0], out[1]


def scales_from_absmax(absmax: Float[np.ndarray, "L Hkv"], margin: float = DEFAULT_SCALE_MARGIN
                       ) -> Float[np.ndarray, "L Hkv"]:
    """Per-layer, per-head scale mapping ``absmax * margin`` onto the fp8 maximum (448)."""
    if not margin >= 1.0:
        raise ValueError(f"fp8 scale margin must be >= 1.0, got {margin}")
    return np.maximum(np.asarray(absmax, np.float32) * margin / FP8_MAX, _MIN_SCALE).astype(np.float32)


def pool_absmax(pool: KVPool) -> tuple[Float[np.ndarray, "L Hkv"], Float[np.ndarray, "L Hkv"]]:
    """Absolute maximum of K and of V per layer and KV head over a (float) pool's contents."""

    def absmax(pages: tuple[Array, ...]) -> np.ndarray:
        return np.stack([np.asarray(jnp.max(jnp.abs(p.astype(jnp.float32)), axis=(1, 2, 3)))
                         for p in pages])

    return absmax(pool.k), absmax(pool.v)
