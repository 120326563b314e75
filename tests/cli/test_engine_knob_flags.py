"""Every engine knob a command takes is EngineFlags' one definition, from `EngineConfig`'s field.

Every command's parsed flag set is searched for flags named like an `EngineConfig` field whose help is not
EngineFlags' (which ends by naming the field): each one must be in `DIFFERENT_MEANING`, a flag that shares
a field's name but not its meaning or its values. That covers flags written as ``DEFINE_*`` calls and
those generated from a command's options dataclass (`jaxpaged/cli/options.py`). The syntax tree of every
module under `jaxpaged/cli` is searched too: a computed flag name (which could hide a field) fails outside
the generators, `flagset.py`, `engine_flags.py` and `options.py`.
"""

import ast
import dataclasses
from pathlib import Path

import pytest

import jaxpaged
from jaxpaged.cli.commands import COMMANDS
from jaxpaged.engine import EngineConfig

CLI = Path(jaxpaged.__file__).parent / "cli"
GENERATORS = {CLI / "flagset.py", CLI / "engine_flags.py", CLI / "options.py"}
FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}

_WORKLOAD_SEED = "the workload's and arrivals' seed, not the weights' and sampling's"
_WORKLOAD_LEN = "unset means the workload's longest context, not the model's (ServingWorkload)"
# (flag, command): why it is not the engine's knob
DIFFERENT_MEANING = {
    **{("seed", c): _WORKLOAD_SEED for c in ("bench serving", "bench ablate", "bench http-overhead",
                                             "bench profile", "simulate serving", "simulate routing")},
    **{("max_model_len", c): _WORKLOAD_LEN for c in ("bench serving", "bench ablate", "bench http-overhead",
                                                     "bench profile")},
    ("seed", "bench replicas"): "the workload's and arrivals' seed; the replicas' engines keep theirs",
    ("seed", "bench throughput"): "also seeds the prompts and the Hugging Face checkpoint's weights",
    ("hash_algo", "bench block-manager"): "a list of algorithms to compare, not one",
    ("eviction_policy", "bench block-manager"): "a list of policies to compare, not one",
    ("dtype", "bench attention"): "the kernel's K/V pool dtype (float8_e4m3fn too), not the weights'",
    ("dtype", "convert"): "the converted checkpoint's weight dtype (three choices)",
    ("model", "convert"): "the checkpoint to convert (a directory or a GGUF file), required, no shipped configs",
}


def _flag_name(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == "name"), None)


def flag_definitions(path: Path) -> list[tuple[str | None, int]]:
    """``(flag name, line)`` of each ``DEFINE_*`` call in ``path``; the name None where it is computed."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if not called.startswith("DEFINE_"):
            continue
        name = _flag_name(node)
        found.append((name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None,
                      node.lineno))
    return found


def engine_knob_flags() -> set[tuple[str, str]]:
    """``{(flag, command)}`` of the flags named like an `EngineConfig` field that EngineFlags did not define."""
    found = set()
    for command in COMMANDS:
        for name, flag in command.load().FLAGS.values._flags().items():
            if name == flag.name and name in FIELDS and not (flag.help or "").endswith(f"(EngineConfig.{name})"):
                found.add((name, command.name))
    return found


def test_every_engine_knob_flag_is_engine_flags_one_definition():
    found = engine_knob_flags()
    strays = sorted(found - set(DIFFERENT_MEANING))
    assert not strays, ("use EngineFlags (a default of its own in defaults=), or add the flag to "
                        f"DIFFERENT_MEANING with the reason: {strays}")
    assert not set(DIFFERENT_MEANING) - found, "allowed flags no longer defined: drop them from the list"
    assert all(name in FIELDS for name, _ in DIFFERENT_MEANING)


def test_no_flag_name_is_computed_outside_the_generators():
    computed = [f"{path.relative_to(CLI)}:{line}" for path in sorted(CLI.rglob("*.py")) if path not in GENERATORS
                for name, line in flag_definitions(path) if name is None]
    assert not computed, f"a computed flag name could hide an engine field: {computed}"


@pytest.mark.parametrize("source, expected", [
    ('FLAGS.DEFINE_integer("max_num_seqs", 8, "h")', [("max_num_seqs", 1)]),
    ('flags.DEFINE_string(name="model", default="x", help="h")', [("model", 1)]),
    ('DEFINE_bool(f"{p}_x", True, "h")', [(None, 1)]),
    ('FLAGS.register_validator("model", ok)', []),
])
def test_the_search_finds_every_way_of_defining_a_flag(tmp_path, source, expected):
    module = tmp_path / "m.py"
    module.write_text(source + "\n")
    assert flag_definitions(module) == expected
