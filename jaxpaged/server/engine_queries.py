"""Named read-only questions about an engine, answered between two steps by whoever owns it.

The engine is touched only by its loop (`AsyncEngine`'s thread, or the engine
core process), so a caller asks by name and gets the answer back:
`await client.query("kv_events")`. Names, not functions, so the same question
crosses to an engine core process (`core.client.CoreClient.query`, answered
by `core.process.EngineCore`). The replicas' event reports and their
`/debug/replicas` view are built from these.
"""

from __future__ import annotations

from jaxpaged.cache.events import AllBlocksCleared, BlockStored, KVEvent
from jaxpaged.router import ReplicaLoad


def engine_load(engine) -> ReplicaLoad:
    """The engine's queue lengths and KV usage."""
    return engine.load()


def cached_hashes(engine) -> set[bytes]:
    """The hashes in the engine's device prefix cache."""
    return engine.cached_block_hashes()


def kv_events(engine) -> tuple[list[KVEvent], ReplicaLoad]:
    """The KV events since the last call (`enable_kv_events` must be on), and the load now."""
    return engine.take_kv_events(), engine_load(engine)


def kv_full_state(engine) -> tuple[list[KVEvent], ReplicaLoad]:
    """Events that rebuild the whole cache: cleared, then every cached hash (the event log restarts here)."""
    engine.take_kv_events()  # already covered by the state below
    hashes = tuple(cached_hashes(engine))
    events: list[KVEvent] = [AllBlocksCleared()]
    if hashes:
        events.append(BlockStored(hashes, None, None, engine.block_size))
    return events, engine_load(engine)


def cache_view(engine) -> tuple[set[bytes], ReplicaLoad, int]:
    """The cached hashes, the load and the eviction count (introspection)."""
    return cached_hashes(engine), engine_load(engine), engine.kv_stats().num_evictions


def kv_address(engine) -> str | None:
    """Where the engine's KV connector serves its blocks (a prefill engine), or None."""
    return engine.kv_connector.address if engine.kv_connector is not None else None


QUERIES = {"kv_events": kv_events, "kv_full_state": kv_full_state, "cache_view": cache_view,
           "kv_address": kv_address}


def answer(engine, name: str):
    """The answer to query `name` (ValueError naming it if there is no such query)."""
    if name not in QUERIES:
        raise ValueError(f"query must be one of {sorted(QUERIES)}, got {name!r}")
    return QUERIES[name](engine)
