"""A command's own options declared once, as a dataclass, and its flags generated from it (docs/cli.md).

Each field made with `jaxpaged.bench.options.option` becomes one flag of the same name, type (a ``tuple[...]``
a comma-separated list), default, help and check; `OptionFlags.options()` gives the parsed flags back as an
instance of the dataclass, so a command hands its benchmark one object instead of a keyword per flag.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence

from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags


def _kind(hint) -> tuple[type, bool]:
    """(the flag's scalar type, whether it is a list) of a field's annotation."""
    if isinstance(hint, types.UnionType):  # X | None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return hint, False


class OptionFlags:
    """The flags of an options dataclass on one command's `FlagSet`, and the parsed options."""

    def __init__(self, fs: FlagSet, options_type: type) -> None:
        """Define a flag per field of ``options_type`` on ``fs``."""
        self._fs, self._type = fs, options_type
        hints = typing.get_type_hints(options_type)
        flagged = [f for f in dataclasses.fields(options_type) if "help" in f.metadata]  # others: given by the command
        self._kinds = {f.name: _kind(hints[f.name]) for f in flagged}
        for field in flagged:
            self._define(field.name, field.default, **field.metadata)

    def _define(self, name: str, default, *, help: str, at_least: float | None,  # noqa: A002
                choices: tuple[str, ...] | None, check: str | None) -> None:
        fs = self._fs
        kind, is_list = self._kinds[name]
        if is_list:
            fs.DEFINE_list(name, [f"{v:g}" if isinstance(v, float) else str(v) for v in default], help)
            if kind is not str and at_least is None:
                raise TypeError(f"{self._type.__name__}.{name}: a list of numbers needs at_least")
            if kind is not str or choices is not None:
                fs.list_of(name, choices=choices, integer_at_least=at_least if kind is int else None,
                           number_at_least=at_least if kind is float else None, allow_empty=not default)
        else:
            fs.define(name, kind, default, help, choices)
            if at_least is not None:
                fs.at_least(at_least, name)
        if check is not None:
            getattr(fs, check)(name)

    def value(self, name: str):
        """The parsed value of option ``name``, list items as the annotated type (a tuple)."""
        value = self._fs[name].value
        kind, is_list = self._kinds[name]
        return tuple(kind(v) for v in value) if is_list and value is not None else value

    def options(self, **overrides):
        """The parsed flags as the options dataclass, with ``overrides`` on top (and for fields that are no flag)."""
        return self._type(**({name: self.value(name) for name in self._kinds} | overrides))


class CommandFlags:
    """A command's whole flag set: its options dataclass, the `EngineConfig` fields it exposes, its output flags."""

    def __init__(self, *options_types: type, engine: Sequence[str] | None = (),
                 engine_defaults: Mapping[str, object] | None = None, **output) -> None:
        """Define the flags: each of ``options_types``'; ``engine`` names the engine fields (None: all, ``()``:
        none) with ``engine_defaults``; ``output`` is `OutputFlags`' defaults (``json_out=..., plot_dir=...``)."""
        self.flags = FlagSet()
        self._options = {t: OptionFlags(self.flags, t) for t in options_types}
        self.engine = EngineFlags(self.flags, engine, defaults=engine_defaults) if engine != () else None
        self.out = OutputFlags(self.flags, **output)

    def options(self, options_type: type | None = None, **overrides):
        """The parsed options of ``options_type`` (default: the first given), `OptionFlags.options`."""
        return self._options[options_type or next(iter(self._options))].options(**overrides)

    def engine_value(self, name: str):
        """The parsed value of engine field ``name``."""
        return self.engine.holders[name].value
