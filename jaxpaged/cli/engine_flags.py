"""Engine flags generated from `EngineConfig`'s fields (each its own help and values, `knob` in
`jaxpaged.engine.config`), checked once by `EngineConfig` itself after parsing, and back into an `EngineConfig`.

A command picks the fields it exposes and may change a default, never the block size's (docs/cli.md).
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Iterable, Mapping

from absl import flags

from jaxpaged.cli.flagset import FlagSet
from jaxpaged.engine import EngineConfig
from jaxpaged.spec_decode.config import SpeculativeConfig


def engine_fields() -> list[dataclasses.Field]:
    """The `EngineConfig` fields that are flags, in declaration order."""
    return [f for f in dataclasses.fields(EngineConfig) if f.metadata.get("flag", True)]


def _kind(field: dataclasses.Field) -> type:
    hint = typing.get_type_hints(EngineConfig)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    args = [str if isinstance(a, type) and issubclass(a, os.PathLike) else a for a in args]  # a path: its text
    args = [str if a is SpeculativeConfig else a for a in args]  # its JSON text
    if len(args) != 1 or args[0] not in (bool, int, float, str):
        raise TypeError(f"EngineConfig.{field.name}: no flag type for {hint} "
                        "(declare it with knob(..., flag=False) or add its type here)")
    return args[0]


def flag_help(field: dataclasses.Field, *, default_replaced: bool = False) -> str:
    """The help of ``field``'s flag: the field's own help text, naming the field. With ``default_replaced`` (a
    command's own default), the text's "(default ...)" note on EngineConfig's default is left out: absl
    prints the command's."""
    if not field.metadata.get("help"):
        raise TypeError(f"EngineConfig.{field.name} has no help text: declare it with knob(default, help)")
    text = field.metadata["help"]
    if default_replaced:
        text = re.sub(r"\s*\(default\b[^)]*\)", "", text)
    return f"{text} (EngineConfig.{field.name})"


class EngineFlags:
    """Some or all `EngineConfig` fields as flags on one command's `FlagSet`."""

    def __init__(self, fs: FlagSet, fields: Iterable[str] | None = None, *,
                 defaults: Mapping[str, object] | None = None) -> None:
        """Define a flag per field in ``fields`` (default: every flag field) on ``fs``.

        ``defaults`` replaces a field's default for this command; the block size keeps EngineConfig's.
        """
        defaults = dict(defaults or {})
        if "block_size" in defaults:
            raise ValueError("block_size's default is EngineConfig's: a command may not change it")
        by_name = {f.name: f for f in engine_fields()}
        names = list(by_name) if fields is None else list(fields)
        unknown = [n for n in [*names, *defaults] if n not in by_name]
        if unknown:
            raise ValueError(f"not EngineConfig flag fields: {unknown}")
        self.holders: dict[str, flags.FlagHolder] = {}
        for name in names:
            field = by_name[name]
            default = defaults.get(name, field.default)
            kind = _kind(field)
            help_text = flag_help(field, default_replaced=default != field.default)
            self.holders[name] = fs.define(name, kind, default, help_text, field.metadata.get("choices"))
        if "model" in self.holders:
            fs.model_name("model")
        fs.after_parse(self._check)

    def kwargs(self) -> dict[str, object]:
        """The parsed flags as `EngineConfig` keyword arguments."""
        return {name: holder.value for name, holder in self.holders.items()}

    def config(self, **overrides) -> EngineConfig:
        """The `EngineConfig` of the flags, with ``overrides`` (fields a command derives) on top."""
        return EngineConfig(**(self.kwargs() | overrides))

    def _check(self, values: flags.FlagValues) -> None:
        try:
            EngineConfig(**{name: values[name].value for name in self.holders})
        except ValueError as error:
            message = str(error)
            found = {m.start(): n for n in self.holders if (m := re.search(rf"\b{n}\b", message))}
            where = f"flag --{found[min(found)]}={values[found[min(found)]].value}" if found else "engine flags"
            raise flags.IllegalFlagValueError(f"{where}: {message}") from None
