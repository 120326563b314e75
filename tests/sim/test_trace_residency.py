"""Issue 28 items 2 and 4 in the simulator: a trace at its own arrivals, and the residency numbers and
Prometheus metrics of the run against the engine's own counters."""

import dataclasses

import pytest

from jaxpaged.metrics import WindowedHitRate, attach_metrics
from jaxpaged.sim.driver import make_sim_engine, simulate
from jaxpaged.sim.scenario import Deployment, run_with_arrivals, summarize_trace
from jaxpaged.sim.traces import load_trace, trace_workload

# 64 blocks of 16 tokens of the tiny model: small enough that a slice of the trace evicts
TINY = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=64 * 16 * 256, block_size=16,
                  max_num_seqs=8, max_num_batched_tokens=256, kv_cache_metrics_sample=1.0)


@pytest.fixture(scope="module")
def requests():
    return trace_workload(load_trace(limit=40), time_scale=0.01, max_model_len=512)


def test_trace_workload_keeps_the_timestamps_scaled_and_the_shared_heads(requests):
    trace = load_trace(limit=40)
    assert [r.arrival_time for r in requests] == pytest.approx([t.arrival_s * 0.01 for t in trace])
    assert all(len(r.prompt_token_ids) + r.max_tokens <= 512 for r in requests)
    same = [(a, b) for a, b in zip(trace, trace[1:]) if a.hash_ids[0] == b.hash_ids[0]]
    assert same  # the trace's shared first block: the cut prompts still start alike
    first = {t.hash_ids[0]: r.prompt_token_ids[:16] for t, r in zip(trace, requests)}
    assert all(r.prompt_token_ids[:16] == first[t.hash_ids[0]] for t, r in zip(trace, requests))


@pytest.mark.parametrize("policy", ["lru", "sieve"])
def test_residency_samples_agree_with_the_engines_counters(requests, policy):
    deployment = dataclasses.replace(TINY, eviction_policy=policy)
    engine, clock = make_sim_engine(deployment.engine_config(), deployment.model_config, deployment.cost_model())
    metrics = attach_metrics(engine)
    result = simulate(engine, clock, [dataclasses.replace(r) for r in requests])
    r, stats = result.kv_residency, engine.kv.stats
    assert r["eviction_policy"] == policy and len(result.records) == len(requests)
    assert stats.num_evictions > 0 and r["evictions_by_reason"]["capacity"] == stats.num_evictions
    # every cached block followed: one lifetime and one idle time per eviction
    assert r["lifetime_s"]["count"] == r["idle_before_evict_s"]["count"] == stats.num_evictions
    assert r["tier_hit_tokens"]["device"] == stats.prefix_hits_tokens > 0
    snap = metrics.snapshot()
    assert snap["jaxpaged:kv_block_lifetime_seconds_count"] == stats.num_evictions
    assert snap["jaxpaged:kv_block_reuse_gap_seconds_count"] == r["reuse_gap_s"]["count"] > 0
    assert snap['jaxpaged:kv_cache_evictions_by_reason_total{reason="capacity"}'] == stats.num_evictions
    assert snap['jaxpaged:prefix_cache_tier_hits_total{tier="device"}'] == stats.prefix_hits_tokens
    assert r["lifetime_s"]["p50"] >= r["idle_before_evict_s"]["p50"] >= 0


def test_trace_summary_counts_goodput_by_both_slos(requests):
    result = run_with_arrivals(TINY, [dataclasses.replace(r) for r in requests])
    loose = summarize_trace("lru", result, ttft_slo_s=1e9, tpot_slo_s=1e9)
    assert loose.goodput_rps == pytest.approx(loose.throughput_rps)
    ttfts = sorted(rec.ttft for rec in result.records)
    cut = ttfts[len(ttfts) // 2]
    half = summarize_trace("lru", result, ttft_slo_s=cut, tpot_slo_s=1e9)
    good = sum(1 for rec in result.records if rec.ttft <= cut)
    assert half.goodput_rps == pytest.approx(good / result.duration_s)


def test_windowed_hit_rate_against_a_plain_sum():
    window = WindowedHitRate(10.0)
    events = [(0.0, 100, 0), (4.0, 100, 50), (9.0, 200, 100), (15.0, 100, 100), (30.0, 0, 0)]
    queries = hits = 0
    history = []
    for now, q, h in events:
        queries, hits = queries + q, hits + h
        history.append((now, q, h))
        got = window.update(now, queries, hits)
        # counts that arrived after now - 10 s (the rate of the window's increments)
        recent = [(q_, h_) for t, q_, h_ in history if t > now - 10.0]
        total_q = sum(q_ for q_, _ in recent)
        assert got == pytest.approx(sum(h_ for _, h_ in recent) / total_q if total_q else 0.0)
