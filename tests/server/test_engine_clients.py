"""Every `EngineClient` the server can serve has all of the protocol's members, with the protocol's parameters.

`build_app` and its routes use only `EngineClient` (engine_client.py); a
member missing from one implementation would be a 500 in that mode only
(as `/v1/cache/pin` was over the engine core process before).
"""

import inspect

import pytest

from jaxpaged.server.async_engine import AsyncEngine
from jaxpaged.server.core.client import CoreClient
from jaxpaged.server.engine_client import EngineClient


def _clients():
    clients = [AsyncEngine, CoreClient]
    try:
        from jaxpaged.server.replicas.disagg import DisaggPool
        from jaxpaged.server.replicas.pool import ReplicaPool
    except ImportError:  # the serve extra (ray[serve]) is not installed
        return clients
    return clients + [ReplicaPool, DisaggPool]


def _members(cls) -> dict:
    return {name: value for name, value in vars(cls).items() if not name.startswith("_")}


PROTOCOL = _members(EngineClient)
DATA = set(EngineClient.__annotations__)  # plain attributes (`model_info`, `error`): set per instance


@pytest.mark.parametrize("cls", _clients(), ids=lambda c: c.__name__)
def test_each_client_implements_every_member_with_the_same_parameters(cls):
    for name, spec in PROTOCOL.items():
        if name in DATA:
            continue
        impl = inspect.getattr_static(cls, name, None)
        assert impl is not None, f"{cls.__name__} has no {name}"
        if isinstance(spec, property):
            assert isinstance(impl, property), f"{cls.__name__}.{name} must be a property"
            continue
        assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(spec), \
            f"{cls.__name__}.{name}: async in one and not the other"
        want = [(p.name, p.kind) for p in inspect.signature(spec).parameters.values()]
        got = [(p.name, p.kind) for p in inspect.signature(impl).parameters.values()]
        assert got == want, f"{cls.__name__}.{name}{inspect.signature(impl)} is not {name}{inspect.signature(spec)}"

