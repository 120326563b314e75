"""Integer helpers shared by the whole package: ceiling division and powers of two."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling of `a / b` for integers (`b > 0`): the blocks needed to hold `a` tokens of `b` each."""
    return -(-a // b)


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= `n` (1 for `n <= 1`)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
