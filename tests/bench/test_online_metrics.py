"""Online-benchmark statistics and arrivals, checked against independent calculations."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from jaxpaged.bench.online.datasets import arrival_offsets
from jaxpaged.bench.online.online_client import RequestResult
from jaxpaged.bench.online.online_metrics import compute_metrics, latency_stats, parse_goodput, peak_concurrency
from jaxpaged.bench.online.online_metrics import online_markdown_table


def linear_percentile(values, p):
    """The textbook linear-interpolation percentile (numpy's default), written out."""
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (rank - low)


def result(rid, *, start, ttft, itl, out, prompt=10, success=True):
    return RequestResult(rid, success=success, prompt_len=prompt, output_tokens=out, start_time=start,
                         ttft=ttft, itl=list(itl), latency=ttft + sum(itl))


# five requests (times in seconds); r4 failed, r3 generated a single token
RESULTS = [
    result("r0", start=0.0, ttft=0.10, itl=[0.02, 0.03, 0.05], out=4),
    result("r1", start=0.5, ttft=0.30, itl=[0.04, 0.04], out=3, prompt=20),
    result("r2", start=1.0, ttft=0.05, itl=[0.01] * 6, out=7),
    result("r3", start=1.1, ttft=0.20, itl=[], out=1, prompt=5),
    result("r4", start=1.2, ttft=0.0, itl=[], out=None, success=False),
]


def test_metrics_match_a_hand_calculation():
    m = compute_metrics(RESULTS, 4.0, goodput_slos={"ttft": 250, "tpot": 30})
    assert (m["completed"], m["failed"]) == (4, 1)
    assert m["total_input_tokens"] == 10 + 20 + 10 + 5 and m["total_output_tokens"] == 4 + 3 + 7 + 1
    assert m["request_throughput"] == pytest.approx(4 / 4.0)
    assert m["output_throughput"] == pytest.approx(15 / 4.0)
    assert m["total_token_throughput"] == pytest.approx((45 + 15) / 4.0)
    ttfts = [0.10, 0.30, 0.05, 0.20]
    tpots = [0.10 / 3, 0.08 / 2, 0.06 / 6]  # (e2e - ttft) / (out - 1); r3 has none
    itls = [0.02, 0.03, 0.05, 0.04, 0.04] + [0.01] * 6
    e2els = [0.20, 0.38, 0.11, 0.20]
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        ms = [v * 1e3 for v in values]
        assert m[f"{name}_mean_ms"] == pytest.approx(sum(ms) / len(ms))
        assert m[f"{name}_median_ms"] == pytest.approx(linear_percentile(ms, 50))
        assert m[f"{name}_p90_ms"] == pytest.approx(linear_percentile(ms, 90))
        assert m[f"{name}_p99_ms"] == pytest.approx(linear_percentile(ms, 99))
        mean = sum(ms) / len(ms)
        assert m[f"{name}_std_ms"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in ms) / len(ms)))
    # good: TTFT <= 250 ms and TPOT <= 30 ms -> r2 (10 ms) and r3 (one token: TPOT counts as 0); r0 33 ms, r1 300 ms
    assert m["request_goodput"] == pytest.approx(2 / 4.0)
    # in flight: r0 [0, 0.2], r1 [0.5, 0.88], r2 [1.0, 1.11], r3 [1.1, 1.3] -> r2 and r3 overlap
    assert m["max_concurrent_requests"] == 2


def test_goodput_without_slos_is_nan_and_each_slo_counts():
    assert math.isnan(compute_metrics(RESULTS, 1.0)["request_goodput"])
    assert compute_metrics(RESULTS, 1.0, goodput_slos={"e2el": 200})["request_goodput"] == 3  # r0, r2, r3
    assert compute_metrics(RESULTS, 1.0, goodput_slos={"ttft": 1000})["request_goodput"] == 4
    with pytest.raises(ValueError, match="unknown goodput SLO"):
        compute_metrics(RESULTS, 1.0, goodput_slos={"itl": 5})
    with pytest.raises(ValueError, match="duration_s"):
        compute_metrics(RESULTS, 0.0)


def test_empty_and_all_failed_runs_summarize_to_nan_latencies():
    m = compute_metrics([RESULTS[4]], 1.0)
    assert (m["completed"], m["failed"], m["total_output_tokens"]) == (0, 1, 0)
    assert math.isnan(m["ttft_mean_ms"]) and math.isnan(m["itl_p99_ms"])
    assert set(latency_stats([], "x")) == {"x_mean_ms", "x_std_ms", "x_median_ms", "x_p90_ms", "x_p99_ms"}


def test_peak_concurrency():
    assert peak_concurrency([]) == 0
    nested = [result("a", start=0, ttft=1, itl=[9], out=2), result("b", start=1, ttft=1, itl=[], out=1),
              result("c", start=2, ttft=1, itl=[], out=1), result("d", start=5, ttft=1, itl=[], out=1)]
    assert peak_concurrency(nested) == 2  # a [0,10] holds b [1,2], c [2,3] (b ends as c starts), d [5,6]
    assert peak_concurrency(nested[1:]) == 1
    assert peak_concurrency(nested + [result("e", start=2.5, ttft=1.5, itl=[], out=1)]) == 3  # a, c, e


@pytest.mark.parametrize("specs, expected", [
    (["ttft:200", "tpot:50"], {"ttft": 200.0, "tpot": 50.0}),
    (["ttft:200,tpot:50.5 e2el:1000"], {"ttft": 200.0, "tpot": 50.5, "e2el": 1000.0}),
    ([], {}),
])
def test_parse_goodput(specs, expected):
    assert parse_goodput(specs) == expected


@pytest.mark.parametrize("spec, match", [("ttft", "NAME:MS"), ("itl:5", "NAME:MS"), ("ttft:abc", "not a number"),
                                         ("tpot:-1", "positive"), ("e2el:inf", "positive")])
def test_parse_goodput_rejects(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_goodput([spec])


def test_markdown_table_columns_and_skipped_rows():
    m = compute_metrics(RESULTS, 4.0)
    table = online_markdown_table({"offline": m, "http": m})
    lines = table.splitlines()
    assert lines[0] == "| metric | offline | http |"
    assert "| successful requests | 4 | 4 |" in lines
    assert not any("goodput" in line for line in lines)  # NaN in every column: no row
    assert any(line.startswith("| ITL p99 (ms) |") for line in lines)


@pytest.mark.parametrize("rate", [0.0, math.inf])
def test_arrivals_all_at_once(rate):
    assert arrival_offsets(5, rate).tolist() == [0.0] * 5


def test_poisson_arrivals_are_exponential_with_the_rate():
    rate = 4.0
    offsets = arrival_offsets(20_000, rate, burstiness=1.0, seed=1)
    assert offsets[0] == 0.0 and len(offsets) == 20_000  # the first request goes at once
    gaps = np.diff(offsets)
    assert np.all(gaps > 0)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert scipy_stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_arrivals_keep_the_mean_and_change_the_spread(burstiness):
    rate = 2.0
    gaps = np.diff(arrival_offsets(40_000, rate, burstiness=burstiness, seed=2))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    assert (gaps.var() / gaps.mean() ** 2) == pytest.approx(1 / burstiness, rel=0.1)  # squared CV
    assert scipy_stats.kstest(gaps, "gamma", args=(burstiness, 0, 1 / (rate * burstiness))).pvalue > 0.01


def test_arrivals_are_seeded_and_validated():
    assert arrival_offsets(0, 3.0).shape == (0,) and arrival_offsets(1, 3.0).tolist() == [0.0]
    assert arrival_offsets(4, 3.0, seed=5).tolist() == arrival_offsets(4, 3.0, seed=5).tolist()
    assert arrival_offsets(4, 3.0, seed=5).tolist() != arrival_offsets(4, 3.0, seed=6).tolist()
    for kwargs, match in (({"request_rate": -1}, "request_rate"), ({"request_rate": math.nan}, "request_rate"),
                          ({"request_rate": 1, "burstiness": 0}, "burstiness"),
                          ({"request_rate": 1, "burstiness": math.inf}, "burstiness")):
        with pytest.raises(ValueError, match=match):
            arrival_offsets(3, **kwargs)
