"""RoPE keys of a Hugging Face config: `rope_theta` + `rope_scaling`, or transformers 5's `rope_parameters`."""

from __future__ import annotations

from typing import Any

from jaxpaged.config import RopeScaling


def read_rope(hf: dict[str, Any], params: dict[str, Any] | None, theta_default: float
              ) -> tuple[float, RopeScaling | None]:
    """RoPE base and scaling from `params` (transformers >= 5's `rope_parameters`), or the older
    `rope_theta` / `rope_scaling` keys of `hf` when `params` is None."""
    if params is not None:
        theta, scaling = params.get("rope_theta", hf.get("rope_theta", theta_default)), params
    else:
        theta, scaling = hf.get("rope_theta", theta_default), hf.get("rope_scaling")
    if (scaling or {}).get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported: RoPE rotates the whole head")
    if not scaling:
        return float(theta), None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type == "linear":
        return float(theta), RopeScaling(factor=float(scaling["factor"]), rope_type="linear")
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; 'llama3' and 'linear' are implemented")
    missing = [key for key in ("factor", "low_freq_factor", "high_freq_factor",
                               "original_max_position_embeddings") if key not in scaling]
    if missing:
        raise ValueError(f"config.json rope_scaling lacks {', '.join(missing)}")
    return float(theta), RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )


def write_rope_scaling(scaling: RopeScaling | None) -> dict[str, Any] | None:
    """HF's `rope_scaling` dict for `scaling`."""
    if scaling is None:
        return None
    if scaling.rope_type == "linear":
        return {"rope_type": "linear", "factor": scaling.factor}
    return {"rope_type": "llama3", "factor": scaling.factor, "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings}
