"""The three request waves the tier tests share: fill the cache, evict it, reuse it."""

import numpy as np


def waves(seed=0):
    """Wave 1 fills the cache with two long prefixes; wave 2 (unrelated) evicts them; wave 3 reuses them."""
    rng = np.random.default_rng(seed)
    shared = [list(rng.integers(0, 250, 41)), list(rng.integers(0, 250, 30))]
    first = [shared[0] + [1, 2], shared[1] + [3]]
    filler = [list(rng.integers(0, 250, int(n))) for n in rng.integers(20, 40, 6)]
    again = [s + list(rng.integers(0, 250, int(n))) for s, n in zip(shared * 2, (2, 5, 9, 1))]
    return first, filler, again
