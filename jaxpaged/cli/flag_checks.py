"""absl validators for the scripts' flags: a bad value is one line on stderr and a non-zero exit.

absl runs validators while parsing, before `main`, and reports a failure as
`FATAL Flags parsing error: flag --NAME=VALUE: MESSAGE`, never a traceback.
Each script calls these right after defining its flags; `None` (an unset
optional flag) always passes.
"""

from __future__ import annotations

import math
from pathlib import Path

from absl import flags


def at_least(low: float, *names: str) -> None:
    """Each numeric flag in `names` must be finite and >= `low` (or unset)."""
    for name in names:
        flags.register_validator(
            name, lambda v, low=low: v is None or (math.isfinite(v) and v >= low),
            message=f"--{name} must be a finite number >= {low}")


def existing_file(*names: str) -> None:
    """Each path flag in `names` must name an existing file (or be unset / empty)."""
    for name in names:
        flags.register_validator(name, lambda v: not v or Path(v).is_file(),
                                 message=f"--{name} must be an existing file")


def positive(*names: str) -> None:
    """Each integer flag in `names` must be >= 1."""
    at_least(1, *names)


def non_negative(*names: str) -> None:
    """Each numeric flag in `names` must be >= 0."""
    at_least(0, *names)


def list_of(name: str, *, choices=None, integer_at_least: int | None = None,
            number_at_least: float | None = None) -> None:
    """Every item of list flag `name` is one of `choices`, or an integer / number >= the bound."""
    def ok(items) -> bool:
        if items is None:
            return True
        for item in items:
            if choices is not None and item not in choices:
                return False
            if integer_at_least is not None and not (_is_int(item) and int(item) >= integer_at_least):
                return False
            if number_at_least is not None and not (_is_number(item) and float(item) >= number_at_least):
                return False
        return bool(items)

    what = (f"one or more of {sorted(choices)}" if choices is not None else
            f"integers >= {integer_at_least}" if integer_at_least is not None else
            f"finite numbers >= {number_at_least}")
    flags.register_validator(name, ok, message=f"--{name} must be a comma-separated list of {what}")


def one_of(name: str, choices) -> None:
    """String flag `name` must be one of `choices` (or unset)."""
    flags.register_validator(name, lambda v: v is None or v in choices,
                             message=f"--{name} must be one of {sorted(choices)}")


def model_name(name: str = "model") -> None:
    """`--model` must name a shipped config, a config JSON file, or a checkpoint directory."""
    from jaxpaged.config import list_configs

    def ok(value) -> bool:
        return value in list_configs() or Path(value).is_dir() or (value.endswith(".json") and Path(value).is_file())

    flags.register_validator(name, ok, message=f"--{name} must be a shipped config ({', '.join(list_configs())}), "
                                                 "a config JSON file or a checkpoint directory")


def device_profile(name: str = "profile") -> None:
    """`--profile` must name a known device profile, "cpu", or an existing profile JSON."""
    from jaxpaged.sim.profiles import GPU_PROFILES
    known = sorted(GPU_PROFILES) + ["cpu"]
    flags.register_validator(name, lambda v: v in known or (v.endswith(".json") and Path(v).is_file()),
                             message=f"--{name} must be one of {known} or a profile JSON file")


def key_values(name: str) -> None:
    """List flag `name` holds `key=number` items."""
    flags.register_validator(
        name, lambda items: all(k and _is_number(v) for k, _, v in (i.partition("=") for i in items)),
        message=f"--{name} must be a comma-separated list of key=number")


def parse_key_values(items: list[str]) -> dict[str, int | float]:
    """`["output_len=64", "jitter=0.1"]` as `{"output_len": 64, "jitter": 0.1}` (items checked by `key_values`)."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = float(value) if "." in value else int(value)
    return out


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False
