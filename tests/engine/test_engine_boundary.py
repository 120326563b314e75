"""Outside code asks the engine, not its parts: no module outside `jaxpaged/engine/` reads an engine's parts."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jaxpaged"
PARTS = {"scheduler", "kv", "runner", "tiers", "input_processor", "output_processor", "_parts"}


def _engine_name(node: ast.expr) -> str | None:
    """`engine`, `self.engine`, `llm.engine`, `self._engine`...: the name an expression ends in, if an engine's."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name if name in ("engine", "_engine") else None


def _reaches(source: str) -> list[tuple[int, str]]:
    return [(node.lineno, f"{_engine_name(node.value)}.{node.attr}") for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in PARTS and _engine_name(node.value)]


def test_the_reach_finder_sees_the_forms_used():
    found = _reaches("engine.kv.stats\nself.engine.runner.busy_s\nx = llm._engine.scheduler\nengine.load()\n"
                     "self.kv.stats\nparts.runner\n")
    assert sorted(found) == [(1, "engine.kv"), (2, "engine.runner"), (3, "_engine.scheduler")]


def test_no_module_outside_the_engine_package_reads_an_engines_parts():
    outside = [path for path in PACKAGE.rglob("*.py") if PACKAGE / "engine" not in path.parents]
    assert len(outside) > 100  # the whole package was read
    reaches = [f"{path.relative_to(PACKAGE.parent)}:{line}: {reach}"
               for path in outside for line, reach in _reaches(path.read_text())]
    assert reaches == [], "ask the engine (jaxpaged/engine/queries.py) instead:\n" + "\n".join(reaches)
