"""Every engine knob a command takes is EngineFlags' one definition, from `EngineConfig`'s field.

The syntax tree of every module under `jaxpaged/cli` is searched for `DEFINE_*` calls (absl's or a
`FlagSet`'s) whose flag name is an `EngineConfig` field: outside `engine_flags.py` each one must be in
`DIFFERENT_MEANING`, a flag that shares a field's name but not its meaning or its values. A computed
flag name (which could hide a field) fails too.
"""

import ast
import dataclasses
from pathlib import Path

import pytest

import jaxpaged
from jaxpaged.engine import EngineConfig

CLI = Path(jaxpaged.__file__).parent / "cli"
ENGINE_FLAGS = CLI / "engine_flags.py"
FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}

# (flag, module under jaxpaged/cli): why it is not the engine's knob
DIFFERENT_MEANING = {
    ("seed", "workload_flags.py"): "the workload's and arrivals' seed, not the weights' and sampling's",
    ("seed", "bench/replicas.py"): "the workload's and arrivals' seed; the replicas' engines keep theirs",
    ("seed", "bench/throughput.py"): "also seeds the prompts and the Hugging Face checkpoint's weights",
    ("seed", "simulate/serving.py"): "the workload's and arrivals' seed of a simulated run",
    ("seed", "simulate/routing.py"): "the workload's and arrivals' seed of a simulated run",
    ("max_model_len", "workload_flags.py"): "unset means the workload's longest context, not the model's",
    ("hash_algo", "bench/block_manager.py"): "a list of algorithms to compare, not one",
    ("eviction_policy", "bench/block_manager.py"): "a list of policies to compare, not one",
    ("dtype", "bench/attention.py"): "the kernel's K/V pool dtype (float8_e4m3fn too), not the weights'",
    ("dtype", "convert.py"): "the converted checkpoint's weight dtype (three choices)",
    ("model", "convert.py"): "the checkpoint to convert (a directory or a GGUF file), required, no shipped configs",
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


def engine_knob_definitions() -> dict[tuple[str, str], int]:
    """``{(flag, module): line}`` of the flags under `jaxpaged/cli` named like an `EngineConfig` field,
    outside EngineFlags; a computed name as ``("<computed>", module)``."""
    found = {}
    for path in sorted(CLI.rglob("*.py")):
        if path == ENGINE_FLAGS:
            continue
        module = path.relative_to(CLI).as_posix()
        for name, line in flag_definitions(path):
            if name is None or name in FIELDS:
                found[(name or "<computed>", module)] = line
    return found


def test_every_engine_knob_flag_is_engine_flags_one_definition():
    found = engine_knob_definitions()
    strays = [f"jaxpaged/cli/{module}:{line} defines --{name}"
              for (name, module), line in found.items() if (name, module) not in DIFFERENT_MEANING]
    assert not strays, ("use EngineFlags (a default of its own in defaults=), or add the flag to "
                        f"DIFFERENT_MEANING with the reason: {strays}")
    assert not set(DIFFERENT_MEANING) - set(found), "allowed flags no longer defined: drop them from the list"
    assert all(name in FIELDS for name, _ in DIFFERENT_MEANING)


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
