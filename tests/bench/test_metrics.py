"""Prometheus metrics agree with the engine's own state in a scripted scenario."""

import urllib.request

import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.metrics import PREFIX, PeriodicLogger, attach_metrics
from jaxpaged.sampling_params import SamplingParams

PROMPT = [5, 9, 14, 200, 3, 77, 1, 2, 8, 8, 31, 64, 99, 100, 101, 7, 6, 250]  # 18 tokens: 4 full blocks of 4
PARAMS = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


def run(engine, request_id, prompt=PROMPT):
    engine.add_request(request_id, prompt, PARAMS)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [out for out in engine.step() if out.finished]
    return outputs


@pytest.fixture
def engine(tiny_model):
    return Engine(EngineConfig(model="tiny", block_size=4, num_blocks=32), tiny_model)


def test_repeated_request_hits_and_counters_match_engine(engine):
    metrics = attach_metrics(engine)
    (first,) = run(engine, "a")
    (second,) = run(engine, "b")
    snap = metrics.snapshot()
    # at most (18 - 1) // 4 = 4 blocks can hit: one prompt token is always computed
    assert second.num_cached_tokens == 16 and first.num_cached_tokens == 0
    assert snap[PREFIX + "prefix_cache_hits_total"] == 16
    assert snap[PREFIX + "prefix_cache_queries_total"] == 2 * len(PROMPT)
    assert snap[PREFIX + "prompt_tokens_total"] == engine.stats.prompt_tokens == len(PROMPT) + 2
    assert snap[PREFIX + "generation_tokens_total"] == engine.stats.generation_tokens == 4
    assert snap[PREFIX + "num_preemptions_total"] == 0
    assert snap[PREFIX + "iteration_tokens_count"] == engine.stats.num_steps
    assert snap[PREFIX + "iteration_tokens_sum"] == engine.stats.prompt_tokens + 2  # 2nd token of each is decoded
    assert snap[PREFIX + "time_to_first_token_seconds_count"] == 2
    assert snap[PREFIX + "e2e_request_latency_seconds_count"] == 2
    assert snap[PREFIX + "inter_token_latency_seconds_count"] == 2  # one gap per 2-token request


def test_usage_gauge_follows_the_pool_and_returns_to_zero(engine):
    metrics = attach_metrics(engine)
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.add_request("b", PROMPT[::-1], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.step()
    snap = metrics.snapshot()
    assert snap[PREFIX + "kv_cache_usage_perc"] == engine.kv.stats.usage > 0
    assert snap[PREFIX + "num_requests_running"] == len(engine.scheduler.running) == 2
    while engine.has_unfinished_requests():
        engine.step()
    snap = metrics.snapshot()
    assert snap[PREFIX + "kv_cache_usage_perc"] == 0.0
    assert snap[PREFIX + "num_requests_running"] == snap[PREFIX + "num_requests_waiting"] == 0


def test_engines_have_separate_registries(tiny_model):
    a = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=32), tiny_model)
    b = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=32), tiny_model)
    ma, mb = attach_metrics(a), attach_metrics(b)  # would raise "Duplicated timeseries" on one registry
    run(a, "x")
    assert ma.snapshot()[PREFIX + "generation_tokens_total"] == 2
    assert mb.snapshot()[PREFIX + "generation_tokens_total"] == 0


def test_http_endpoint_serves_the_registry(engine):
    metrics = attach_metrics(engine)
    server, _thread = metrics.serve(0, addr="127.0.0.1")
    try:
        run(engine, "a")
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics").read().decode()
    finally:
        server.shutdown()
    assert f"{PREFIX}generation_tokens_total 2.0" in body


def test_periodic_logger_line(engine):
    lines, now = [], [0.0]
    logger = PeriodicLogger(5.0, log=lines.append, clock=lambda: now[0])
    engine.stat_loggers.append(logger)
    engine.add_request("a", PROMPT, PARAMS)
    engine.step()
    assert lines == []  # interval not reached
    now[0] = 10.0
    while engine.has_unfinished_requests():
        engine.step()
    assert len(lines) == 1
    assert f"Avg prompt throughput: {len(PROMPT) / 10:.1f} tokens/s" in lines[0]
    assert "KV cache usage" in lines[0] and "Prefix cache hit rate: 0.0%" in lines[0]
