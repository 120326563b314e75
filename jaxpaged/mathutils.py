"""Integer helpers shared by the whole package: ceiling division, powers of two, the dropped index."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling of `a / b` for integers (`b > 0`): the blocks needed to hold `a` tokens of `b` each."""
    return -(-a // b)


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= `n` (1 for `n <= 1`)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pow2_bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum); 0 stays 0 (an absent group)."""
    if n <= 0:
        return 0
    return next_power_of_two(max(n, minimum))


DROPPED = 2**30  # a row or token index past any batch or vocabulary: the device scatters drop it
