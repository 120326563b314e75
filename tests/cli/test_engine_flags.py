"""Engine flags are generated from `EngineConfig`'s fields and come back as the same field values."""

import dataclasses
import typing

import pytest
from absl import flags

from jaxpaged.cli.engine_flags import EngineFlags, engine_fields
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.engine import EngineConfig
from jaxpaged.spec_decode import SpeculativeConfig

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
    if kind is SpeculativeConfig:  # its flag is JSON text
        return SpeculativeConfig(num_speculative_tokens=2), '--speculative_config={"num_speculative_tokens": 2}'
    if "choices" in field.metadata:
        value = next(c for c in field.metadata["choices"] if c != field.default)
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
    needed = {a[2:].split("=")[0] for a in NEEDS.get(field.name, [])}
    needed |= {name.removeprefix("no") for name in needed}  # --noflag sets a boolean flag
    others = {f.name for f in engine_fields()} - {field.name} - needed
    assert all(getattr(config, n) == getattr(EngineConfig(), n) for n in others)  # nothing else moved


def test_each_flags_help_and_values_are_its_fields_own(every_field):
    fs, _ = every_field
    declared = {f.name: f for f in dataclasses.fields(EngineConfig)}
    assert EngineConfig.describe() == {name: f.metadata["help"] for name, f in declared.items()}
    assert {name for name in declared if name not in fs.values} == {"kv_scales"}  # arrays: Python API only
    for name, field in declared.items():
        help_text = field.metadata.get("help")
        assert isinstance(help_text, str) and help_text.strip(), f"EngineConfig.{name} has no help"
        if name == "kv_scales":
            continue
        flag = fs[name]
        choices = field.metadata.get("choices")
        prefix = f"<{'|'.join(choices)}>: " if choices else ""  # absl lists an enum's values first
        assert flag.help == f"{prefix}{help_text} (EngineConfig.{name})"
        assert (list(flag.parser.enum_values) if choices else None) == (list(choices) if choices else None)
        needs = ({"host_cache_bytes": 1 << 20} if name == "preemption_mode"
                 else {"kv_peers": "tcp://127.0.0.1:5600"} if name == "kv_role" else {})
        for value in choices or ():
            assert getattr(EngineConfig(**{name: value}, **needs), name) == value  # the flag offers what it takes
    assert "<paged|contiguous>: paged, or contiguous" in fs.values.get_help()


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


def test_a_replaced_default_drops_the_fields_note_on_its_own_default():
    """`kv_cache_bytes`' help explains its unset default ("default 256 MiB"); a command that sets 32 MiB must
    not say so beside absl's own "(default: '33554432')"."""
    fs = FlagSet()
    EngineFlags(fs, ["kv_cache_bytes", "num_blocks"], defaults={"kv_cache_bytes": 32 << 20})
    note = EngineConfig.__dataclass_fields__["kv_cache_bytes"].metadata["help"]
    assert "(default 256 MiB)" in note
    assert fs.values["kv_cache_bytes"].help == "KV pool size in bytes (EngineConfig.kv_cache_bytes)"
    assert "(default: as many as kv_cache_bytes holds)" in fs.values["num_blocks"].help  # its default stands
