"""Issue 28 items 1, 4 and 5 over HTTP: the Grafana dashboard's PromQL against a live server's /metrics, the
residency metrics, and pinned prefixes (`POST /v1/cache/pin`, the `pin_ttl_s` request field).

One `jaxpaged serve` for the module: tiny model, a 32-block pool, LRU (a policy that protects reused
blocks would keep the unpinned control prefix too), every cached block sampled.
"""

import itertools

import httpx
import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jaxpaged.bench.online.dashboard_check import dashboard_queries
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.bench.online.http_run import residency_delta, scrape_kv_metrics
from tests.suite_cache import SUITE_CACHE

CACHE = SUITE_CACHE  # the suite's compile cache (tests/suite_cache.py)
ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0",
       "JAX_COMPILATION_CACHE_DIR": str(CACHE), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
BS, NUM_BLOCKS = 16, 32
ARGS = ["--model=tiny", f"--block_size={BS}", f"--kv_budget_tokens={BS * NUM_BLOCKS}", "--max_model_len=256",
        "--max_num_seqs=4", "--max_num_batched_tokens=256", "--eviction_policy=lru", "--kv_cache_metrics_sample=1"]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(ARGS, env=ENV) as proc:
        yield proc


def complete(server, prompt, **extra):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "ignore_eos": True} | extra
    return httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120.0, trust_env=False)


def cached_tokens(response) -> int:
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def scrape(server) -> dict[str, list]:
    """Every exported sample, by sample name: (labels, value) pairs."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=30.0, trust_env=False).text
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


_FLOOD_IDS = itertools.count(1)


def flood(server, count: int = 6) -> None:
    """Never-seen 96-token prompts (7 blocks with the output): with 32 blocks, they evict what is not pinned."""
    for _ in range(count):
        n = next(_FLOOD_IDS)
        assert complete(server, [n % 250, n // 250 % 250] + [5] * 94).status_code == 200


def test_a_pinned_prefix_outlives_a_flood_that_evicts_an_unpinned_one(server):
    pinned, unpinned = [7] * 64, [9] * 64
    response = httpx.post(f"{server.base_url}/v1/cache/pin", json={"prompt": pinned, "ttl_s": 600},
                          timeout=30.0, trust_env=False)
    assert response.status_code == 200 and response.json()["cached_blocks"] == 0  # pinned before it is cached
    assert cached_tokens(complete(server, pinned)) == 0
    assert cached_tokens(complete(server, unpinned)) == 0
    assert cached_tokens(complete(server, unpinned)) == 48  # 3 of its 4 blocks (one token is always computed)
    flood(server)
    assert cached_tokens(complete(server, unpinned)) == 0, "the flood should have evicted the unpinned prefix"
    assert cached_tokens(complete(server, pinned)) == 48, "the pinned prefix must survive"
    samples = scrape(server)
    assert samples["jaxpaged:kv_cache_pinned_blocks"][0][1] == 4
    by_reason = {labels["reason"]: v for labels, v in samples["jaxpaged:kv_cache_evictions_by_reason_total"]}
    assert by_reason["capacity"] > 0 and by_reason["pinned"] == 0


def test_the_pin_ttl_s_field_pins_a_request_prompt_and_ttl_zero_unpins(server):
    prompt = [11] * 64
    assert cached_tokens(complete(server, prompt, pin_ttl_s=600.0)) == 0
    flood(server)
    assert cached_tokens(complete(server, prompt)) == 48
    response = httpx.post(f"{server.base_url}/v1/cache/pin", json={"prompt": prompt, "ttl_s": 0},
                          timeout=30.0, trust_env=False)
    assert response.status_code == 200 and response.json()["cached_blocks"] == 4
    flood(server)
    assert cached_tokens(complete(server, prompt)) == 0, "unpinned, it is evicted like any other"


@pytest.mark.parametrize("body,param", [({"prompt": [1] * 20, "ttl_s": -1}, "ttl_s"),
                                        ({"prompt": [1] * 20, "ttl_s": 1e9}, "ttl_s"),
                                        ({"prompt": [], "ttl_s": 5}, "prompt"),
                                        ({"ttl_s": 5}, None)])
def test_bad_pins_are_400s_and_change_nothing(server, body, param):
    before = scrape(server)["jaxpaged:kv_cache_pinned_blocks"][0][1]
    response = httpx.post(f"{server.base_url}/v1/cache/pin", json=body, timeout=30.0, trust_env=False)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    bad = complete(server, [1] * 20, pin_ttl_s=-5)
    assert bad.status_code == 400 and "ttl_s" in bad.json()["error"]["message"]
    assert scrape(server)["jaxpaged:kv_cache_pinned_blocks"][0][1] == before


def test_every_dashboard_query_parses_and_names_exported_metrics(server):
    flood(server, count=2)  # some traffic, so every residency histogram has samples
    samples = scrape(server)
    for name in ("jaxpaged:kv_block_lifetime_seconds_count", "jaxpaged:kv_block_idle_before_evict_seconds_count",
                 "jaxpaged:kv_block_reuse_gap_seconds_count"):
        assert samples[name][0][1] > 0, f"{name}: no sample after evictions with every block sampled"
    queries = dashboard_queries()
    assert len({q.panel for q in queries}) >= 12
    for query in queries:
        expr = promql_parser.parse(query.expr)  # raises on a malformed query
        selectors, groupings = [], []

        def visit(node):
            if isinstance(node, promql_parser.VectorSelector):
                selectors.append(node.name)
            if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
                groupings.extend(node.modifier.labels)

        promql_parser.walk(expr, visit)
        assert selectors, f"{query.panel}: names no metric"
        for name in selectors:
            assert name in samples, f"{query.panel}: {name} is not exported by the server"
            labels = {key for labels, _ in samples[name] for key in labels}
            for label in groupings:
                assert label in labels, f"{query.panel}: {name} has no label {label!r}"


def test_the_http_benchmark_reads_the_servers_residency_over_its_run(server):
    before = scrape_kv_metrics(server.base_url)
    flood(server, count=2)
    delta = residency_delta(before, scrape_kv_metrics(server.base_url))
    samples = scrape(server)
    assert delta["evictions_by_reason"]["capacity"] > 0 and delta["evictions_by_reason"]["pinned"] == 0
    assert delta["lifetime_seconds"]["count"] == delta["evictions_by_reason"]["capacity"]  # every block sampled
    assert delta["pinned_blocks"] == samples["jaxpaged:kv_cache_pinned_blocks"][0][1]
    assert delta["tier_hit_tokens"]["host"] == 0
