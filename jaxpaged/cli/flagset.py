"""`FlagSet`: one command's absl flags in its own `FlagValues`, with the checks its flags need.

Every command keeps its flags apart, so all commands import into one process
(the CLI's `--help`, the tests) without two `--model` flags colliding. A bad
value fails while parsing, before the command runs, as one line:
`FATAL Flags parsing error: flag --NAME=VALUE: MESSAGE`. `None` (an unset
optional flag) always passes a check.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from absl import flags


class FlagSet:
    """A command's flags: ``fs.DEFINE_integer(...)`` as absl's, plus the checks below."""

    def __init__(self) -> None:
        """An empty set; the command defines its flags on it at import."""
        self.values = flags.FlagValues()
        self._after_parse: list[Callable[[flags.FlagValues], None]] = []
        self._adopted: list[str] = []

    def __getattr__(self, name: str):
        """``DEFINE_*``, ``mark_flag_as_required``, ``register_validator`` and ``register_multi_flags_validator``:
        absl's, bound to this set's `FlagValues`; else a flag's value."""
        if name.startswith(("DEFINE_", "register_")) or name == "mark_flag_as_required":
            return functools.partial(getattr(flags, name), flag_values=self.values)
        if name != "values" and name in self.values:
            return getattr(self.values, name)
        raise AttributeError(name)

    def __getitem__(self, name: str) -> flags.Flag:
        """The flag ``name`` (``fs["batch"].value``)."""
        return self.values[name]

    def define(self, name: str, kind: type, default, help: str,  # noqa: A002
               choices: Sequence[str] | None = None) -> flags.FlagHolder:
        """A flag whose values are of Python type ``kind`` (bool, int, float, str), an enum with ``choices``."""
        if choices is not None:
            return self.DEFINE_enum(name, default, list(choices), help)
        define = {bool: self.DEFINE_boolean, int: self.DEFINE_integer, float: self.DEFINE_float,
                  str: self.DEFINE_string}[kind]
        return define(name, default, help)

    def adopt(self, holders: Sequence[flags.FlagHolder]) -> None:
        """Take flags a library module defined on absl's global set: a copy here, its value handed back on parse.

        The library's holders (``distributed.NUM_PROCESSES.value``) then read what this command parsed,
        while another command's checks on the same names stay out of this one.
        """
        for holder in holders:
            flag = copy.deepcopy(flags.FLAGS[holder.name])
            flag.validators = []
            self.values[holder.name] = flag
            self._adopted.append(holder.name)

    def after_parse(self, check: Callable[[flags.FlagValues], None]) -> None:
        """Run ``check(values)`` once every flag is parsed; it raises `flags.IllegalFlagValueError` on bad input."""
        self._after_parse.append(check)

    def parse(self, argv: Sequence[str]) -> list[str]:
        """Parse ``argv`` (``argv[0]`` is the program) and run every check; the positional arguments left.

        Every flag starts again from its default, so one process can parse a command twice (the tests do).
        """
        self.values.unparse_flags()
        rest = self.values(list(argv))
        for check in self._after_parse:
            check(self.values)
        for name in self._adopted:
            flags.FLAGS[name].value = self.values[name].value
        return rest

    def at_least(self, low: float, *names: str) -> None:
        """Each numeric flag in ``names`` must be finite and >= ``low`` (or unset)."""
        for name in names:
            self.register_validator(name, lambda v, low=low: v is None or (math.isfinite(v) and v >= low),
                                    message=f"--{name} must be a finite number >= {low}")

    def positive(self, *names: str) -> None:
        """Each integer flag in ``names`` must be >= 1."""
        self.at_least(1, *names)

    def non_negative(self, *names: str) -> None:
        """Each numeric flag in ``names`` must be >= 0."""
        self.at_least(0, *names)

    def rate(self, name: str) -> None:
        """Rate flag ``name`` must be >= 0; inf (everything at once, as ``vllm bench serve``) is allowed."""
        self.register_validator(name, lambda v: v >= 0, message=f"--{name} must be >= 0 (0 or inf = all at once)")

    def fraction(self, name: str) -> None:
        """Float flag ``name`` must be in [0, 1)."""
        self.register_validator(name, lambda v: 0 <= v < 1, message=f"--{name} must be in [0, 1)")

    def positive_number(self, name: str) -> None:
        """Float flag ``name`` must be a positive finite number."""
        self.register_validator(name, lambda v: 0 < v < math.inf, message=f"--{name} must be a positive finite number")

    def port(self, name: str) -> None:
        """Integer flag ``name`` must be a TCP port, 1 to 65535 (or unset)."""
        self.register_validator(name, lambda v: v is None or 1 <= v <= 65535, message=f"--{name} must be in [1, 65535]")

    def existing_file(self, *names: str) -> None:
        """Each path flag in ``names`` must name an existing file (or be unset / empty)."""
        for name in names:
            self.register_validator(name, lambda v: not v or Path(v).is_file(),
                                    message=f"--{name} must be an existing file")

    def list_of(self, name: str, *, choices=None, integer_at_least: int | None = None,
                number_at_least: float | None = None, allow_empty: bool = False) -> None:
        """Every item of list flag ``name`` is one of ``choices``, or an integer / number >= the bound; the list
        is not empty unless ``allow_empty``."""
        def ok(items) -> bool:
            if items is None:
                return True
            try:
                if integer_at_least is not None and any(int(i) < integer_at_least for i in items):
                    return False
                if number_at_least is not None and not all(_is_number(i) and float(i) >= number_at_least
                                                           for i in items):
                    return False
            except ValueError:  # not an integer
                return False
            return (choices is None or set(items) <= set(choices)) and (bool(items) or allow_empty)

        what = (f"one or more of {sorted(choices)}" if choices is not None else
                f"integers >= {integer_at_least}" if integer_at_least is not None else
                f"finite numbers >= {number_at_least}")
        self.register_validator(name, ok, message=f"--{name} must be a comma-separated list of {what}")

    def model_name(self, name: str = "model") -> None:
        """``--model`` must name a shipped config, a config JSON file, a checkpoint directory or a GGUF file."""
        from jaxpaged.config import list_configs
        from jaxpaged.gguf_file import is_gguf_file

        def ok(value) -> bool:
            return value in list_configs() or Path(value).is_dir() or is_gguf_file(value) or (
                value.endswith(".json") and Path(value).is_file())

        self.register_validator(name, ok, message=f"--{name} must be a shipped config ({', '.join(list_configs())}), "
                                                  "a config JSON file, a checkpoint directory or a GGUF file (the default "
                                                  "pretrained GGUF: `make model` fetches it)")

    def device_profile(self, name: str = "profile") -> None:
        """``--profile`` must name a known device profile, "cpu", or an existing profile JSON."""
        from jaxpaged.sim.profiles import GPU_PROFILES
        known = sorted(GPU_PROFILES) + ["cpu"]
        self.register_validator(name, lambda v: v in known or (v.endswith(".json") and Path(v).is_file()),
                                message=f"--{name} must be one of {known} or a profile JSON file")

    def key_values(self, name: str) -> None:
        """List flag ``name`` holds ``key=number`` items."""
        self.register_validator(
            name, lambda items: all(k and _is_number(v) for k, _, v in (i.partition("=") for i in items)),
            message=f"--{name} must be a comma-separated list of key=number")


def parse_key_values(items: list[str]) -> dict[str, int | float]:
    """``["output_len=64", "jitter=0.1"]`` as ``{"output_len": 64, "jitter": 0.1}`` (checked by `key_values`)."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = float(value) if "." in value else int(value)
    return out


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False
