"""Engine flags are generated from `EngineConfig`'s fields and come back as the same field values."""

import dataclasses
import typing

import pytest
from absl import flags

from jaxpaged.cli.engine_flags import CHOICES, EngineFlags, engine_fields
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.engine import EngineConfig

# what a field needs beside it to be valid (EngineConfig's cross-field rules)
NEEDS = {"disk_cache_dir": ["--host_cache_bytes=1048576"], "preemption_mode": ["--host_cache_bytes=1048576"],
         "save_prefix_cache_on_shutdown": ["--prefix_cache_snapshot=snap"]}


@pytest.fixture(scope="module")
def every_field():
    fs = FlagSet()
    return fs, EngineFlags(fs)


def _other_value(field: dataclasses.Field):
    """A valid value of ``field`` that is not its default, and how it is written on the command line."""
    hint = typing.get_type_hints(EngineConfig)[field.name]
    kind = next(a for a in (typing.get_args(hint) or (hint,)) if a is not type(None))
    if field.name in CHOICES:
        value = next(c for c in CHOICES[field.name] if c != field.default)
    elif kind is bool:
        value = not field.default
        return value, f"--{'' if value else 'no'}{field.name}"
    elif kind is int:
        value = (field.default or 1) * 2
    elif kind is float:
        value = field.default + 0.5
    else:
        value = {"model": "small", "dtype": "bfloat16"}.get(field.name, "some/dir")
    return value, f"--{field.name}={value}"


@pytest.mark.parametrize("field", engine_fields(), ids=lambda f: f.name)
def test_each_flag_round_trips_to_its_field(every_field, field):
    fs, engine = every_field
    value, arg = _other_value(field)
    fs.parse(["prog", arg, *NEEDS.get(field.name, [])])
    config = engine.config()
    assert getattr(config, field.name) == value != field.default
    others = {f.name for f in engine_fields()} - {field.name} - {a[2:].split("=")[0] for a in NEEDS.get(field.name, [])}
    assert all(getattr(config, n) == getattr(EngineConfig(), n) for n in others)  # nothing else moved


def test_defaults_are_engine_configs_own(every_field):
    fs, engine = every_field
    fs.parse(["prog"])
    assert engine.config() == EngineConfig()
    assert fs["block_size"].default == EngineConfig.block_size


def test_a_value_engine_config_refuses_is_a_flag_error_naming_it(every_field):
    fs, _ = every_field
    with pytest.raises(flags.IllegalFlagValueError, match=r"^flag --max_num_seqs=0: max_num_seqs must be at least 1"):
        fs.parse(["prog", "--max_num_seqs=0"])
    with pytest.raises(flags.IllegalFlagValueError, match=r"flag --disk_cache_dir=d: disk_cache_dir needs the host"):
        fs.parse(["prog", "--disk_cache_dir=d"])


def test_a_command_may_change_a_default_but_not_the_block_sizes():
    fs = FlagSet()
    engine = EngineFlags(fs, ["block_size", "max_num_batched_tokens"], defaults={"max_num_batched_tokens": 2048})
    fs.parse(["prog"])
    assert engine.kwargs() == {"block_size": EngineConfig.block_size, "max_num_batched_tokens": 2048}
    with pytest.raises(ValueError, match="block_size"):
        EngineFlags(FlagSet(), ["block_size"], defaults={"block_size": 32})
    with pytest.raises(ValueError, match="not EngineConfig flag fields"):
        EngineFlags(FlagSet(), ["kv_scales"])
