"""A prefill engine and a decode engine in one process, over the ZeroMQ transport: the hop changes no token.

The reference is a colocated engine without prefix caching (every token
computed where it is used). Each engine is driven by hand; the prefill
engine's block server answers pulls on its own thread.
"""

import dataclasses
import time

import numpy as np
import pytest

from jaxpaged.bench.online.server_process import free_port
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
from jaxpaged.offload.transfer import transfer_traces
from jaxpaged.sampling_params import SamplingParams

BS = 4
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
PREFILL_ONLY = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
SHARED = list(range(3, 3 + 4 * BS))  # four shared blocks


def _config(**kw):
    # ZeroMQ: every engine here shares this process, which may start only one jax transfer server
    return EngineConfig(model="tiny", num_blocks=48, block_size=BS, max_num_batched_tokens=64,
                        pool_fill_value=float("nan"), kv_transport="zmq", **kw)


def _run(engine, requests, *, params=GREEDY):
    """Add every (id, prompt, salt) and step until all finished; the token ids by request id."""
    for rid, prompt, salt in requests:
        engine.add_request(rid, prompt, params, cache_salt=salt)
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
    return {rid: out for rid, out in outs.items()}


@pytest.fixture(scope="module")
def prefill(tiny_model):
    engine = Engine(_config(kv_role="prefill", kv_listen="tcp://127.0.0.1:0"), model=tiny_model)
    yield engine
    engine.shutdown()


def _decode(model, prefill_engine, **kw):
    return Engine(_config(kv_role="decode", kv_peers=prefill_engine.kv_connector.address, **kw), model=model)


@pytest.fixture(scope="module")
def decode(tiny_model, prefill):
    engine = _decode(tiny_model, prefill)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model):
    return Engine(_config(enable_prefix_caching=False), model=tiny_model)


def _tokens(outs, rid):
    return outs[rid].outputs[0].token_ids


def _hop(prefill, decode, requests):
    """Prefill each prompt (one token), then decode it: the decode engine's outputs."""
    _run(prefill, [(f"p-{rid}", prompt, salt) for rid, prompt, salt in requests], params=PREFILL_ONLY)
    return _run(decode, requests)


def test_greedy_tokens_equal_colocated_and_only_missing_blocks_are_pulled(prefill, decode, reference):
    first = [("a", SHARED + [40, 41, 42, 43, 44, 45], None)]
    second = [("b", SHARED + [50, 51, 52, 53, 54], None), ("c", [7] * 9, None)]
    want = _run(reference, first + second)
    stats = decode.kv_connector.stats
    got = _hop(prefill, decode, first)
    assert _tokens(got, "a") == _tokens(want, "a")
    assert stats.blocks_received == 5 and stats.refused == stats.failed == 0  # (22 - 1) // 4 blocks
    assert got["a"].num_cached_tokens == 5 * BS  # landed, not computed: only the last 2 prompt tokens ran
    held_before = stats.blocks_already_held
    got = _hop(prefill, decode, second)
    for rid in ("b", "c"):
        assert _tokens(got, rid) == _tokens(want, rid)
    # b shares four blocks with a: decode already caches them, so it pulls only its fifth (and c its two)
    assert stats.blocks_already_held - held_before == 4
    assert stats.blocks_received == 5 + 1 + 2
    assert got["b"].num_cached_tokens == 5 * BS and got["c"].num_cached_tokens == 2 * BS
    decode.kv.check_invariants()
    assert decode.kv.stats.num_used_blocks == 0


def test_block_moves_of_every_count_one_request_needs_were_compiled_at_start(prefill, decode):
    """Each engine compiled its block moves before its first request (the hop above compiled nothing new
    either: its greedy tokens are the colocated engine's): a prefill engine's outbox gather and a decode
    engine's scatter of any count of blocks up to one request's compile nothing now."""
    max_blocks = -(-decode.max_model_len // BS)  # one KV cache group
    traces = transfer_traces()
    block = np.zeros(decode.runner.kv_block_shape, decode.runner.kv_dtype)
    for count in range(1, max_blocks + 1):
        assert len(prefill.runner.read_blocks([0] * count)) == count
        decode.runner.write_blocks([decode.runner.num_blocks] * count, [block] * count)  # out of range: dropped
    assert transfer_traces() == traces


def test_cache_salt_isolation_holds_across_the_hop(prefill, decode, reference):
    prompt = [9, 8, 7, 6] * 3 + [1]
    want = _run(reference, [("r", prompt, None)])
    stats = decode.kv_connector.stats
    _run(prefill, [("salted", prompt, "tenant-a")], params=PREFILL_ONLY)
    received = stats.blocks_received
    got = _run(decode, [("other-tenant", prompt, "tenant-b")])  # same tokens, another namespace
    assert stats.blocks_received == received and got["other-tenant"].num_cached_tokens == 0
    got = _run(decode, [("same-tenant", prompt, "tenant-a")])
    assert stats.blocks_received == received + 3 and got["same-tenant"].num_cached_tokens == 3 * BS
    assert _tokens(got, "same-tenant") == _tokens(want, "r")


def test_blocks_of_another_model_are_refused(tiny_config, prefill, reference):
    other = init_model(tiny_config, seed=1)
    decode = _decode(other, prefill)
    prompt = list(range(60, 60 + 3 * BS + 2))
    _run(prefill, [("x", prompt, None)], params=PREFILL_ONLY)
    got = _run(decode, [("x", prompt, None)])
    want = _run(Engine(_config(enable_prefix_caching=False), model=other), [("x", prompt, None)])
    assert decode.kv_connector.stats.refused == 1 and decode.kv_connector.stats.blocks_received == 0
    assert got["x"].num_cached_tokens == 0 and _tokens(got, "x") == _tokens(want, "x")
    decode.shutdown()


def test_a_peer_that_does_not_answer_makes_decode_recompute_and_decodes_keep_running(tiny_model, reference):
    slow = Engine(_config(kv_role="prefill", kv_serve_delay_s=1.5), model=tiny_model)
    decode = _decode(tiny_model, slow, kv_transfer_timeout_s=0.5)
    prompt = list(range(80, 80 + 3 * BS + 1))
    long_run = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    _run(slow, [("s", prompt, None)], params=PREFILL_ONLY)
    decode.add_request("running", [5, 6, 7], long_run)
    while not decode.step():
        pass
    decode.add_request("s", prompt, GREEDY)
    assert decode.kv_connector.is_loading("s")
    tokens_while_loading, start = 0, time.monotonic()
    outs = {}
    while decode.kv_connector.is_loading("s"):
        for out in decode.step():
            tokens_while_loading += out.request_id == "running"
            outs[out.request_id] = out
    assert tokens_while_loading > 0  # the running sequence kept decoding during the pull
    assert time.monotonic() - start >= 0.4
    while decode.has_unfinished_requests():
        for out in decode.step():
            outs[out.request_id] = out
    want = _run(reference, [("s", prompt, None)])
    stats = decode.kv_connector.stats
    assert stats.failed == 1 and stats.blocks_received == 0 and outs["s"].num_cached_tokens == 0
    assert _tokens(outs, "s") == _tokens(want, "s")
    decode.shutdown()
    slow.shutdown()


def test_a_request_aborted_while_its_blocks_load_leaks_nothing(tiny_model):
    slow = Engine(_config(kv_role="prefill", kv_serve_delay_s=0.5), model=tiny_model)
    decode = _decode(tiny_model, slow)
    prompt = list(range(90, 90 + 2 * BS + 1))
    _run(slow, [("q", prompt, None)], params=PREFILL_ONLY)
    decode.add_request("q", prompt, GREEDY)
    decode.abort("q")
    outs = _run(decode, [])
    assert outs["q"].outputs[0].finish_reason == "abort" and not decode.kv_connector.num_loading
    assert decode.kv.stats.num_used_blocks == 0
    decode.shutdown()
    slow.shutdown()


def test_a_sliding_window_model_moves_each_groups_blocks(tiny_config):
    """KV cache groups (a sliding group of window 16, a full group): keys are (hash, group); the pools start
    as NaN, so a sliding group reading a block it did not get back would turn the tokens into NaN."""
    hybrid = init_model(tiny_config.replace(sliding_window=16, layer_types=("sliding_attention", "full_attention")),
                        seed=3)
    prefill = Engine(_config(kv_role="prefill"), model=hybrid)
    decode = _decode(hybrid, prefill)
    prompt = list(range(100, 140))  # 9 full blocks admission can restore, 4 tokens each
    _run(prefill, [("h", prompt, None)], params=PREFILL_ONLY)
    got = _run(decode, [("h", prompt, None)])
    want = _run(Engine(_config(enable_prefix_caching=False), model=hybrid), [("h", prompt, None)])
    stats = decode.kv_connector.stats
    assert stats.blocks_wanted == 9 * 2 and stats.refused == stats.failed == 0
    assert 9 < stats.blocks_received <= 9 * 2  # every full-group block, and the sliding group's that were kept
    assert got["h"].num_cached_tokens == 9 * BS and _tokens(got, "h") == _tokens(want, "h")
    decode.kv.check_invariants()
    decode.shutdown()
    prefill.shutdown()


def test_decode_pulls_from_the_engine_its_request_names_else_asks_every_peer_at_once(tiny_model, prefill, reference):
    """The first peer never answers: waiting for it would fail the pull after the timeout (counted in
    `failed`)."""
    dead = f"tcp://127.0.0.1:{free_port()}"
    decode = Engine(_config(kv_role="decode", kv_peers=f"{dead},{prefill.kv_connector.address}",
                            kv_transfer_timeout_s=5.0), model=tiny_model)
    prompt = list(range(110, 110 + 3 * BS + 1))
    _run(prefill, [("n", prompt, None)], params=PREFILL_ONLY)
    named = dataclasses.replace(GREEDY, kv_source=prefill.kv_connector.address)
    got = _run(decode, [("n", prompt, None)], params=named)
    stats = decode.kv_connector.stats
    assert stats.failed == 0 and stats.blocks_received == 3 and got["n"].num_cached_tokens == 3 * BS
    assert _tokens(got, "n") == _tokens(_run(reference, [("n", prompt, None)]), "n")
    # no kv_source: every peer is asked at once and the prefill engine's complete answer is taken without
    # waiting for the dead peer (asked first in turn, its timeout would have counted one failed pull)
    prompt = list(range(130, 130 + 3 * BS + 1))
    _run(prefill, [("u", prompt, None)], params=PREFILL_ONLY)
    got = _run(decode, [("u", prompt, None)])
    assert stats.failed == 0 and stats.blocks_received == 6 and got["u"].num_cached_tokens == 3 * BS
    assert _tokens(got, "u") == _tokens(_run(reference, [("u", prompt, None)]), "u")
    decode.shutdown()
