"""Checks for user-supplied settings: each raises ValueError naming the field, the value and the limit.

Every error is a `ValueError` (a server maps it to a client error): a wrong
type too, since to a caller it is just another bad value. Booleans are not
accepted as integers or floats, and floats must be finite.
"""

from __future__ import annotations

import math
import numbers

INT32_MAX = 2**31 - 1


def check_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int:
    """`value` as a Python int, if it is an integer (not a bool) in `[low, high]`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}")
    return value


def check_optional_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int | None:
    """`check_int`, with None passed through."""
    return None if value is None else check_int(name, value, low=low, high=high)


def check_float(name: str, value, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, allow_nan: bool = False) -> float:
    """`value` as a Python float, if it is a finite real number (not a bool) in range.

    `low_open` makes the lower bound exclusive; `allow_nan` admits NaN (and
    infinities), for fields where those are meaningful.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        if allow_nan:
            return value
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name} must be {'greater than' if low_open else 'at least'} {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    """`value` if it is a bool (numpy bools included)."""
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_str(name: str, value, *, choices: tuple[str, ...] | None = None) -> str:
    """`value` if it is a str (and one of `choices` when given)."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, got {value!r} ({type(value).__name__})")
    if choices is not None and value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_optional_str(name: str, value) -> str | None:
    """`check_str`, with None passed through."""
    return None if value is None else check_str(name, value)
