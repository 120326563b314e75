"""`ReplicaPool`'s index, loads and liveness from replica reports, without a Ray cluster (a fake handle)."""

import asyncio

import pytest

pytest.importorskip("ray.serve", reason="the replicas need the serve extra (ray[serve])")

from jaxpaged.cache.events import AllBlocksCleared, BlockRemoved, BlockStored  # noqa: E402
from jaxpaged.config import load_config  # noqa: E402
from jaxpaged.router import ReplicaLoad, RequestHasher  # noqa: E402
from jaxpaged.server.replicas import pinned_router  # noqa: E402
from jaxpaged.server.replicas.messages import Accepted, ModelInfo, RemoteError, ReplicaReport  # noqa: E402
from jaxpaged.server.replicas.pool import ReplicaPool  # noqa: E402
from jaxpaged.server.replicas.replica import RESYNC  # noqa: E402
from jaxpaged.tokenizer import ByteTokenizer  # noqa: E402

BLOCK = 4
DEPLOYMENT = "FakeReplicas"


class FakeHandle:
    """Records each generate call's target and answers with a fixed first item."""

    def __init__(self, first=Accepted()):
        self.first = first
        self.targets = []

    def options(self, **_):
        return self

    @property
    def generate(self):
        return self

    def remote(self, request_id, prompt, params, cache_salt, priority, tenant, limits, target_replica):
        self.targets.append(target_replica)
        first = self.first

        async def stream():
            yield first
        return stream()


def make_pool(handle=None, **kwargs):
    config = load_config("tiny")
    info = ModelInfo(ByteTokenizer(), config, 512, BLOCK, "sha256")
    return ReplicaPool(handle or FakeHandle(), info, deployment=DEPLOYMENT, **kwargs)


def stored(hashes):
    return BlockStored(tuple(hashes), None, None, BLOCK)


def report(replica, events, *, first=False, resync=False, load=ReplicaLoad()):
    return ReplicaReport(replica, f"actor-{replica}", events, load, first=first, resync=resync)


def test_reports_build_the_index_and_unknown_replicas_are_asked_to_resync():
    pool = make_pool()
    hashes = RequestHasher(BLOCK).block_hashes(list(range(1, 13)))
    assert pool.on_report(report("r1", [AllBlocksCleared(), stored(hashes)], first=True)) is None
    assert pool.router.index.blocks_of("r1") == set(hashes)
    pool.on_report(report("r1", [BlockRemoved((hashes[2],))]))
    assert pool.router.index.blocks_of("r1") == set(hashes[:2])
    assert pool.on_report(report("r2", [stored(hashes)])) == RESYNC  # not its first report: ingress lost it
    assert "r2" not in pool.router.replicas
    pool.on_report(report("r2", [AllBlocksCleared(), stored(hashes[:1])], resync=True))
    assert pool.router.index.blocks_of("r2") == {hashes[0]}


def test_a_replica_serve_no_longer_lists_leaves_the_index_and_its_late_reports_are_ignored():
    async def run():
        pool = make_pool()
        hashes = RequestHasher(BLOCK).block_hashes(list(range(1, 9)))
        pool.on_report(report("r1", [AllBlocksCleared(), stored(hashes)], first=True))
        pool.on_report(report("r2", [AllBlocksCleared()], first=True))
        pinned_router._membership[DEPLOYMENT] = frozenset({"r1", "r2"})
        pool.start()
        await asyncio.sleep(0.3)
        assert pool.router.replicas == ["r1", "r2"]
        pinned_router._membership[DEPLOYMENT] = frozenset({"r2", "r3"})  # r1 died; r3 replaces it
        await asyncio.sleep(0.3)
        assert pool.router.replicas == ["r2"]
        assert pool.router.index.match(hashes) == {}
        assert pool.on_report(report("r1", [stored(hashes)])) is None  # a late report from the dead one
        assert pool.router.replicas == ["r2"]
        pool.shutdown()
    try:
        asyncio.run(run())
    finally:
        pinned_router._membership.pop(DEPLOYMENT, None)


def test_a_silent_replica_leaves_after_the_liveness_timeout():
    async def run():
        pool = make_pool(liveness_timeout_s=0.2)
        pool.on_report(report("r1", [AllBlocksCleared()], first=True))
        pool.start()
        await asyncio.sleep(0.6)
        assert pool.router.replicas == [] and not pool.is_running
        pool.shutdown()
    asyncio.run(run())


def test_requests_go_to_the_replica_holding_their_prefix_and_refusals_come_back_as_their_error():
    async def run():
        handle = FakeHandle()
        pool = make_pool(handle)
        prompt = list(range(1, 30))
        hashes = RequestHasher(BLOCK).block_hashes(prompt)
        pool.on_report(report("r1", [AllBlocksCleared()], first=True))
        pool.on_report(report("r2", [AllBlocksCleared(), stored(hashes)], first=True))
        for i in range(3):
            await pool.add_request(f"q{i}", prompt, None)
        assert handle.targets == ["r2"] * 3
        with pytest.raises(ValueError) as err:
            handle.first = RemoteError("ValueError", "max_tokens must be >= 1")
            await pool.add_request("bad", prompt, None)
        assert "max_tokens" in str(err.value)
    asyncio.run(run())


def test_loads_count_the_ingress_requests_in_flight():
    pool = make_pool()
    pool.on_report(report("r1", [AllBlocksCleared()], first=True, load=ReplicaLoad(5, 0, 0.5)))
    pool._replicas["r1"].in_flight = 3
    assert pool._load("r1") == ReplicaLoad(num_waiting=3, num_running=0, kv_usage=0.5)
    pool._replicas["r1"].in_flight = 8
    assert pool._load("r1") == ReplicaLoad(num_waiting=5, num_running=3, kv_usage=0.5)
