"""The offline side of the offline-vs-HTTP comparison, and the comparison's arithmetic."""

import math

import pytest

from jaxpaged.bench.online.datasets import BenchRequest, random_requests
from jaxpaged.bench.offline.driver import median_summary
from jaxpaged.bench.online.http_overhead import compare_offline_http, comparison_table, http_cost, offline_results
from jaxpaged.bench.online.online_metrics import compute_metrics
from jaxpaged.engine import Engine, EngineConfig


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(EngineConfig(model="tiny", block_size=16, num_blocks=32, max_model_len=128, max_num_seqs=4,
                               max_num_batched_tokens=64), tiny_model)


def test_offline_results_match_the_engine_outputs(engine):
    requests = random_requests(3, input_len=12, output_len=4, range_ratio=0.5, seed=0)
    requests.append(BenchRequest("text", "hello there", 11, 3))
    results, duration = offline_results(engine, requests, [0.0, 0.0, 0.02, 0.03])
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    for r, request in zip(results, requests):
        assert r.success and r.finish_reason == "length"
        assert r.output_tokens == request.output_len and len(r.itl) == request.output_len - 1
        assert r.prompt_len == request.prompt_len
        assert 0 < r.ttft <= r.latency == pytest.approx(r.ttft + sum(r.itl))
        assert r.start_time + r.latency <= engine.clock()
    assert duration >= max(r.latency for r in results)
    m = compute_metrics(results, duration)
    assert m["completed"] == 4 and m["total_output_tokens"] == sum(r.output_len for r in requests)
    with pytest.raises(ValueError, match="arrival offsets"):
        offline_results(engine, requests, [0.0])


def test_http_cost_and_table():
    offline = {"request_throughput": 2.0, "ttft_mean_ms": 10.0, "tpot_mean_ms": 1.0, "completed": 4,
               "request_goodput": math.nan}
    http = {"request_throughput": 1.5, "ttft_mean_ms": 14.5, "tpot_mean_ms": 1.25, "completed": 4,
            "request_goodput": math.nan}
    assert http_cost(offline, http) == {"request_throughput": 0.75, "ttft_mean_ms": 4.5, "tpot_mean_ms": 0.25}
    lines = comparison_table(offline, http).splitlines()
    assert lines[0] == "| metric | offline | HTTP | HTTP - offline |"
    assert "| TTFT mean (ms) | 10.0 | 14.5 | +4.5 |" in lines
    assert "| request throughput (req/s) | 2.000 | 1.500 | x0.750 |" in lines
    assert "| successful requests | 4 | 4 |  |" in lines
    assert not any("goodput" in line for line in lines)


def test_median_summary_and_interleaved_runs():
    assert median_summary([{"a": 1.0, "b": math.nan}, {"a": 5.0, "b": math.nan}, {"a": 2.0, "b": 3.0}]) == {
        "a": 2.0, "b": 3.0}
    assert math.isnan(median_summary([{"a": math.nan}])["a"])
    calls = []

    def side(name, value):
        def run():
            calls.append(name)
            return value, 1.0
        return run

    result = compare_offline_http(side("offline", 1.0), side("http", 2.0),
                                  lambda v, d: {"x_ms": v, "request_throughput": 1 / v}, repeats=2,
                                  warmup_runs=2)
    assert calls == ["offline", "http"] * 4  # two warm-ups each, then alternating
    assert result["median"] == {"offline": {"x_ms": 1.0, "request_throughput": 1.0},
                                "http": {"x_ms": 2.0, "request_throughput": 0.5}}
    assert result["http_cost"] == {"x_ms": 1.0, "request_throughput": 0.5}
    with pytest.raises(ValueError, match="repeats"):
        compare_offline_http(side("o", 1), side("h", 1), lambda v, d: {}, repeats=0)
