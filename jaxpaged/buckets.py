"""Shape buckets: pad step sizes to powers of two so the step compiles a bounded number of times."""

from __future__ import annotations

from jaxpaged.mathutils import next_power_of_two


def pow2_bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum); 0 stays 0 (an absent group)."""
    if n <= 0:
        return 0
    return next_power_of_two(max(n, minimum))
