"""`AsyncEngine` survives any client: cancelled adds, unread or closed streams, gone event loops, shutdown
mid-admission; and two input rules (`top_p` too small for float32, what `reset_prefix_cache` clears).

In-process (no HTTP): the loop is stalled with `stall_for_test`, as a long
compile would, so that clients give up while their adds are queued or being
applied. Served outputs are compared with the same engine stepped by hand
afterwards (greedy outputs do not depend on batching).
"""

import asyncio
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.runner.sampling import SamplingBatch, sample
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.async_engine import AsyncEngine, EngineDeadError, reset_prefix_cache

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(EngineConfig(model="tiny", num_blocks=64, max_model_len=256), model=tiny_model)


def _by_hand(engine, prompt, params=GREEDY):
    """The request run alone on the (idle) engine, stepped directly."""
    engine.add_request("by-hand", prompt, params)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out
    return final.outputs[0].token_ids


async def _idle(async_engine):
    while await async_engine.call_in_loop(lambda e: e.has_unfinished_requests()):
        await asyncio.sleep(0.02)


def test_clients_cancelled_while_their_adds_wait_or_are_applied(engine):
    async_engine = AsyncEngine(engine)
    async_engine.start()
    generated = engine.stats.generation_tokens

    async def scenario():
        await async_engine.stall_for_test(1.0)  # the loop is busy (a compile) ...
        await asyncio.sleep(0.05)
        # ... and will be again, right after taking the adds below: 1 s, so the cancels 0.35 s after it took
        # them land well before it applies them, however late a loaded machine wakes this coroutine
        await async_engine.stall_for_test(1.0)
        waiting = [asyncio.ensure_future(async_engine.add_request(f"w{i}", [1, 2, 3 + i], LONG)) for i in range(4)]
        taken = [asyncio.ensure_future(async_engine.add_request(f"t{i}", [4, 5, 6 + i], LONG)) for i in range(4)]
        await asyncio.sleep(0.3)
        for task in waiting:  # cancelled before the loop took their adds
            task.cancel()
        await asyncio.sleep(1.0)
        for task in taken:  # cancelled after the loop took them, before it applied them (it is stalled)
            task.cancel()
        results = await asyncio.gather(*waiting, *taken, return_exceptions=True)
        await _idle(async_engine)
        served = [out async for out in await async_engine.add_request("after", [7, 8, 9], GREEDY)][-1]
        used = await async_engine.call_in_loop(lambda e: e.kv.stats.num_used_blocks)
        return results, served, used

    results, served, used = asyncio.run(scenario())
    assert async_engine.is_running and async_engine.error is None
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert used == 0
    assert engine.stats.generation_tokens - generated == len(served.outputs[0].token_ids)  # nothing else ran
    async_engine.shutdown()
    assert async_engine.error is None
    assert served.outputs[0].token_ids == _by_hand(engine, [7, 8, 9])


def test_an_unread_stream_closed_aborts_its_request(engine):
    async_engine = AsyncEngine(engine)
    async_engine.start()
    generated = engine.stats.generation_tokens

    async def scenario():
        stream = await async_engine.add_request("unread", [3, 1, 4], LONG)
        await stream.aclose()  # never iterated (an async generator's aclose would skip its finally here)
        await _idle(async_engine)

    asyncio.run(scenario())
    assert engine.stats.generation_tokens - generated < LONG.max_tokens
    assert not engine.has_request("unread") and engine.kv.stats.num_used_blocks == 0
    async_engine.shutdown()
    assert async_engine.error is None


def test_a_client_whose_event_loop_closed_does_not_kill_the_loop(engine):
    async_engine = AsyncEngine(engine)
    async_engine.start()

    async def leave():  # adds a request, then its event loop ends while outputs are still coming
        await async_engine.add_request("orphan", [2, 7, 1], SamplingParams(temperature=0, max_tokens=20,
                                                                            ignore_eos=True))

    asyncio.run(leave())

    async def after():
        await _idle(async_engine)
        return [out async for out in await async_engine.add_request("after", [7, 8, 9], GREEDY)][-1]

    served = asyncio.run(after())
    assert async_engine.is_running
    async_engine.shutdown()
    assert async_engine.error is None
    assert served.outputs[0].token_ids == _by_hand(engine, [7, 8, 9])


def test_shutdown_without_drain_while_adds_are_queued_saves_the_snapshot(tiny_model, tmp_path):
    snapshot = tmp_path / "snapshot"
    engine = Engine(EngineConfig(model="tiny", num_blocks=64, max_model_len=256, prefix_cache_snapshot=str(snapshot),
                                 save_prefix_cache_on_shutdown=True), model=tiny_model)
    async_engine = AsyncEngine(engine, drain_timeout_s=0)
    async_engine.start()

    async def scenario():
        first = [out async for out in await async_engine.add_request("first", list(range(1, 40)), GREEDY)]
        await async_engine.stall_for_test(0.5)
        await asyncio.sleep(0.05)
        running = asyncio.ensure_future(async_engine.add_request("run", [5, 6, 7], LONG))
        gone = asyncio.ensure_future(async_engine.add_request("gone", [5, 6, 8], LONG))
        await asyncio.sleep(0.1)
        stopper = threading.Thread(target=async_engine.shutdown)  # SIGTERM, while both adds wait
        stopper.start()
        gone.cancel()  # uvicorn cancels the handlers it no longer waits for
        results = await asyncio.gather(running, gone, return_exceptions=True)
        await asyncio.to_thread(stopper.join)
        return first, results

    first, (running, gone) = asyncio.run(scenario())
    assert first[-1].finished
    assert isinstance(running, EngineDeadError) and isinstance(gone, asyncio.CancelledError)
    assert async_engine.error is None
    assert (snapshot / "prefix_cache.json").exists()
    assert engine.kv.stats.num_used_blocks == 0


@pytest.mark.parametrize("top_p", [1e-40, 1e-30, 1e-7])
def test_tiny_top_p_keeps_the_top_token(top_p):
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, 64)), jnp.float32)
    params = SamplingBatch(temperature=jnp.full((4,), 1.0), top_k=jnp.full((4,), -1, jnp.int32),
                           top_p=jnp.full((4,), SamplingParams(top_p=top_p).top_p, jnp.float32),
                           seeds=jnp.arange(4, dtype=jnp.uint32), counters=jnp.zeros((4,), jnp.int32))
    tokens, _ = sample(logits, params)
    assert tokens.tolist() == jnp.argmax(logits, axis=-1).tolist()


def test_reset_clears_the_device_and_the_host_tier(tiny_model):
    engine = Engine(EngineConfig(model="tiny", num_blocks=24, block_size=4, max_num_batched_tokens=64,
                                 host_cache_bytes=1 << 20), model=tiny_model)
    prompt, flood = list(range(1, 33)), [[100 + 7 * i + j for j in range(40)] for i in range(3)]

    def cached(p, request_id):
        engine.add_request(request_id, p, GREEDY)
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                final = out if out.request_id == request_id else final
        return final.num_cached_tokens

    def evict_to_host(tag):
        for i, p in enumerate(flood):
            cached(p, f"{tag}{i}")

    cached(prompt, "p0")
    evict_to_host("a")
    assert cached(prompt, "p1") > 0 and engine.tiers.stats.host_hits > 0  # control: the host tier serves it
    evict_to_host("b")
    assert len(engine.tiers.host) > 0
    assert reset_prefix_cache(engine)
    assert len(engine.tiers.host) == 0
    assert cached(prompt, "p2") == 0
