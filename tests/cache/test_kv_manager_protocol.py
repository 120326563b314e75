"""The KV manager's capabilities are declared in `KVManager`, never probed.

Both managers answer every member of the protocol (what one of them lacks, it
says so through the member: `unitary`, `eviction_policy`, `residency`,
`pin_prefix`), and no module of the package asks a KV manager what it is or
has (`isinstance`, `type`, `hasattr`, `getattr` on a `kv` / `manager` / `mgr`).
"""

import ast
import inspect
from pathlib import Path

import pytest

import jaxpaged
from jaxpaged.cache import KVCacheManager, KVManager
from jaxpaged.cache.contiguous import ContiguousKVCacheManager
from jaxpaged.cache.kv_groups import kv_cache_layout

PROBES = {"isinstance", "type", "hasattr", "getattr"}
MANAGER_NAMES = {"kv", "manager", "mgr"}


def _protocol_members() -> set[str]:
    members = set(KVManager.__annotations__)
    members |= {name for name, _ in inspect.getmembers(KVManager) if not name.startswith("_")}
    return members - set(dir(object))


@pytest.mark.parametrize("make", [
    lambda: KVCacheManager(8, 4),
    lambda: KVCacheManager(8, 4, kv_cache_layout((None, 8))),
    lambda: ContiguousKVCacheManager(8, 4, max_model_len=16),
], ids=["paged", "paged-sliding", "contiguous"])
def test_every_manager_answers_every_member(make):
    manager = make()
    missing = [name for name in sorted(_protocol_members()) if not hasattr(manager, name)]
    assert not missing, f"{type(manager).__name__} lacks {missing}"
    assert isinstance(manager.unitary, bool) and isinstance(manager.eviction_policy, str)


def test_what_a_manager_lacks_it_says():
    contiguous = ContiguousKVCacheManager(8, 4, max_model_len=16)
    assert not contiguous.unitary and contiguous.eviction_policy == "none" and contiguous.residency is None
    with pytest.raises(ValueError, match="pinning needs the paged KV layout"):
        contiguous.pin_prefix([1, 2, 3, 4, 5], 10.0)
    assert KVCacheManager(8, 4).unitary and not KVCacheManager(8, 4, kv_cache_layout((None, 8))).unitary


def _manager_probes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES
                and node.args):
            continue
        subject = node.args[0]
        name = subject.id if isinstance(subject, ast.Name) else getattr(subject, "attr", None)
        if name in MANAGER_NAMES:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_probes_a_kv_manager():
    root = Path(jaxpaged.__file__).parent
    probes = [probe for path in sorted(root.rglob("*.py")) for probe in _manager_probes(path)]
    assert not probes, "declare the capability in jaxpaged/cache/protocol.py instead:\n" + "\n".join(probes)
