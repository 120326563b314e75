"""When each request of an online benchmark is sent: Poisson or gamma arrivals, or all at once.

Inter-arrival gaps are drawn from a gamma distribution with shape
``burstiness`` and scale ``1 / (request_rate * burstiness)``, as ``vllm bench
serve`` does: the mean gap is ``1 / request_rate`` whatever the burstiness;
``burstiness == 1`` is a Poisson process (exponential gaps); smaller values are
burstier (squared coefficient of variation ``1 / burstiness``), larger ones
more regular. A rate of 0 or infinity sends everything at once.
"""

from __future__ import annotations

import math

import numpy as np
from jaxtyping import Float


def arrival_offsets(num_requests: int, request_rate: float, *, burstiness: float = 1.0,
                    seed: int = 0) -> Float[np.ndarray, " n"]:
    """Seconds from the start at which each of ``num_requests`` requests is sent (non-decreasing).

    The first request goes at 0 and each later one a random gap after the one
    before, as ``vllm bench serve`` sends them.
    """
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if not request_rate >= 0:  # also rejects NaN
        raise ValueError(f"request_rate must be >= 0 (0 or inf = all at once), got {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a positive finite number, got {burstiness}")
    if request_rate == 0 or math.isinf(request_rate):
        return np.zeros(num_requests)
    scale = 1.0 / (request_rate * burstiness)
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=scale, size=max(num_requests - 1, 0))
    return np.concatenate([np.zeros(min(num_requests, 1)), np.cumsum(gaps)])
