"""What a part can do is declared, never probed: no `hasattr`, no `getattr(obj, "name", default)`, and no
`isinstance` against one of the package's classes with behaviour (a runner, a KV manager, a queue, a
tokenizer) anywhere in `jaxpaged/`.

A capability is a member of the part's protocol (`jaxpaged.runner.protocol.RunnerCapabilities`,
`jaxpaged.cache.protocol.KVManager.unitary`, `jaxpaged.scheduler.policy.WaitingQueue`,
`jaxpaged.tokenizer.Tokenizer.vocabulary_form`, ...). `isinstance` stays for telling apart values of plain
data (builtins, dataclasses, named tuples, enums, structs, request bodies, exceptions): which message,
event or error a value is, not what an object can do.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jaxpaged"
DATA_BASES = {"NamedTuple", "Struct", "Enum", "IntEnum", "StrEnum", "BaseModel", "BaseException", "Exception"}


def _final_name(node: ast.expr) -> str | None:
    """`Name` -> "Name", `pkg.mod.Name` -> "Name"; None for anything else."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(_final_name(d.func if isinstance(d, ast.Call) else d) == "dataclass" for d in node.decorator_list)


def _is_plain_data(node: ast.ClassDef, data: set[str]) -> bool:
    """A dataclass, or a subclass of a data base, of an exception, or of a class already found plain data."""
    bases = {_final_name(b) for b in node.bases}
    return (_is_dataclass(node) or bool(bases & (DATA_BASES | data))
            or any(b is not None and b.endswith(("Error", "Exception")) for b in bases))


def behaviour_classes(sources: list[str]) -> set[str]:
    """Names of the classes defined in `sources` that are not plain data (a name defined both ways counts)."""
    classes = [node for source in sources for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]
    data: set[str] = set()
    while True:  # to a fixed point: a subclass of our plain data (an error deriving from ours) is plain data
        more = {node.name for node in classes if _is_plain_data(node, data)} - data
        if not more:
            return {node.name for node in classes if not _is_plain_data(node, data)}
        data |= more


def probes(source: str, behaviour: set[str]) -> list[tuple[int, str]]:
    """Each probe in `source` as (line, what): hasattr, getattr with a literal name and a default, and
    isinstance / issubclass against a class in `behaviour`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        name, args = node.func.id, node.args
        if name == "hasattr":
            found.append((node.lineno, ast.unparse(node)))
        elif name == "getattr" and len(args) == 3 and isinstance(args[1], ast.Constant):
            found.append((node.lineno, ast.unparse(node)))
        elif name in ("isinstance", "issubclass") and len(args) == 2:
            kinds = args[1].elts if isinstance(args[1], ast.Tuple) else [args[1]]
            if any(_final_name(kind) in behaviour for kind in kinds):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_probe_finder_sees_each_form_and_spares_plain_data():
    defined = ("class Runner:\n    pass\n"
               "@dataclasses.dataclass\nclass Event:\n    pass\n"
               "class Refused(ValueError):\n    pass\n"
               "class Message(msgspec.Struct):\n    pass\n")
    behaviour = behaviour_classes([defined])
    assert behaviour == {"Runner"}
    source = ("hasattr(runner, 'busy_s')\n"
              "getattr(runner, 'wait_s', 0.0)\n"
              "isinstance(runner, (str, runner_mod.Runner))\n"
              "getattr(config, name)\n"
              "isinstance(event, Event) or isinstance(err, Refused) or isinstance(msg, M.Message)\n"
              "isinstance(value, (str, int, dict))\n")
    assert [line for line, _ in probes(source, behaviour)] == [1, 2, 3]


def test_no_module_of_the_package_probes_what_an_object_can_do():
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 100  # the whole package was read
    sources = {path: path.read_text() for path in paths}
    behaviour = behaviour_classes(list(sources.values()))
    assert {"ModelRunner", "KVCacheManager", "FairQueue", "HFTokenizer"} <= behaviour
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
             for path, source in sources.items() for line, what in probes(source, behaviour)]
    assert found == [], "declare the capability on the part's protocol instead:\n" + "\n".join(found)
