"""`option`: a field of a benchmark's options dataclass, carrying what its command-line flag needs.

The dataclass is the benchmark's input; `jaxpaged.cli.options.OptionFlags`
turns its fields into the command's flags, so each option is declared once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


def option(default, help: str, *, at_least: float | None = None,  # noqa: A002
           choices: Sequence[str] | None = None, check: str | None = None):
    """An options field: its default, its flag's help, and its check.

    ``at_least`` bounds a number (or every item of a list); ``choices`` fixes a string's
    values (an enum flag) or a list's items; ``check`` names a `FlagSet` check taking the
    flag's name ("existing_file", "model_name", "device_profile", "key_values", "rate", "fraction",
    "positive_number", "port").
    """
    if not help:
        raise ValueError("every option needs its help text")
    metadata = {"help": help, "at_least": at_least, "choices": None if choices is None else tuple(choices),
                "check": check}
    return dataclasses.field(default=default, metadata=metadata)
