"""The online benchmark end to end against one live `jaxpaged serve` subprocess (tiny model, loopback)."""

import json

import pytest

from jaxpaged.bench.online.datasets import BenchRequest, prefix_repetition_requests, sharegpt_requests
from jaxpaged.bench.online.online_client import fetch_model_name, run_requests
from jaxpaged.bench.online.online_metrics import compute_metrics
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.tokenizer import ByteTokenizer
from tests.suite_cache import SUITE_CACHE

CACHE = SUITE_CACHE  # the suite's compile cache (tests/suite_cache.py)
# the engine settings of the server, which `jaxpaged bench http-overhead` must mirror offline
ENGINE = {"block_size": 16, "kv_budget_tokens": 1024, "max_model_len": 128, "max_num_seqs": 8,
          "max_num_batched_tokens": 256}
ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0",
       "JAX_COMPILATION_CACHE_DIR": str(CACHE), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--model=tiny", *(f"--{k}={v}" for k, v in ENGINE.items())], env=ENV) as proc:
        yield proc


def check_consistent(results, duration, requests):
    """Every request succeeded with exactly its output length; the summary agrees with the records."""
    assert all(r.success for r in results), [r.error for r in results if not r.success]
    for r, request in zip(results, requests):
        assert r.request_id == request.request_id
        assert r.output_tokens == request.output_len  # ignore_eos: exactly max_tokens
        assert r.prompt_len == request.prompt_len  # the server's usage agrees with the dataset's count
        assert r.finish_reason == "length"
        assert 1 <= len(r.itl) + 1 <= r.output_tokens  # a chunk per step, one or more tokens each
        assert 0 < r.ttft <= r.latency == pytest.approx(r.ttft + sum(r.itl))
    m = compute_metrics(results, duration)
    assert (m["completed"], m["failed"]) == (len(requests), 0)
    assert m["total_output_tokens"] == sum(r.output_len for r in requests)
    assert m["total_input_tokens"] == sum(r.prompt_len for r in requests)
    assert m["output_throughput"] == pytest.approx(m["total_output_tokens"] / duration)
    assert m["request_throughput"] == pytest.approx(len(requests) / duration)
    assert duration >= m["e2el_p99_ms"] / 1e3 * 0.999 and m["e2el_mean_ms"] >= m["ttft_mean_ms"]
    assert 1 <= m["max_concurrent_requests"] <= len(requests)
    return m


def test_token_prompts_all_at_once(server):
    model = fetch_model_name(server.base_url)
    assert model == "tiny"
    requests = prefix_repetition_requests(6, prefix_len=32, suffix_len=8, num_prefixes=2, output_len=5, seed=0)
    results, duration = run_requests(server.base_url, model, requests, [0.0] * 6)
    check_consistent(results, duration, requests)
    again, duration = run_requests(server.base_url, model, requests, [0.0] * 6)
    check_consistent(again, duration, requests)
    assert all(r.cached_tokens >= 32 for r in again)  # every prefix (two 16-token blocks) is cached by now


def test_text_prompts_with_arrivals_and_a_bad_request(server, tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": f"question number {i} é?"},
                                                   {"from": "gpt", "value": "an answer"}]} for i in range(4)]))
    requests = sharegpt_requests(path, 4, tokenizer=ByteTokenizer(), output_len=4)
    results, duration = run_requests(server.base_url, "tiny", requests, [0.0, 0.05, 0.1, 0.15], max_concurrency=2)
    m = check_consistent(results, duration, requests)
    assert m["max_concurrent_requests"] <= 2
    too_long = BenchRequest("too-long", [1] * 200, 200, 4)  # over max_model_len = 128: a 400, nothing else hurt
    results, _ = run_requests(server.base_url, "tiny", [too_long, requests[0]], [0.0, 0.0])
    assert not results[0].success and results[0].error.startswith("HTTP 400")
    assert results[1].success and results[1].output_tokens == 4


def test_bench_serving_http_backend(server, tmp_path, run_command):
    out = run_command("bench serving", "--backend=http", f"--base_url={server.base_url}", "--dataset_name=prefix_repetition",
                     "--num_prompts=5", "--prefix_repetition_prefix_len=16", "--prefix_repetition_suffix_len=4",
                     "--prefix_repetition_num_prefixes=2", "--prefix_repetition_output_len=6", "--request_rate=20",
                     "--burstiness=0.5", "--seed=3", "--goodput", "ttft:100000", "e2el:100000", "--progress=false",
                     f"--json_out={tmp_path}/h.json", f"--md_out={tmp_path}/h.md")
    result = json.loads((tmp_path / "h.json").read_text())
    m = result["metrics"]
    assert result["model"] == "tiny" and result["goodput_slos_ms"] == {"ttft": 100000.0, "e2el": 100000.0}
    assert (m["completed"], m["failed"], m["total_output_tokens"]) == (5, 0, 30)
    assert m["request_goodput"] == pytest.approx(m["request_throughput"])  # SLOs nobody misses
    assert all(r["success"] and r["output_tokens"] == 6 and r["prompt_len"] == 20 for r in result["requests"])
    assert (tmp_path / "h.md").read_text().startswith("| metric | http |") and "| TTFT p99 (ms) |" in out


def test_bench_http_overhead_against_the_same_server(server, tmp_path, run_command):
    engine_flags = [f"--{k}={v}" for k, v in ENGINE.items()]  # the offline engine mirrors the server
    run_command("bench http-overhead", "--model=tiny", "--start_server=false", f"--base_url={server.base_url}",
               *engine_flags, "--dataset_name=random",
               "--num_prompts=3", "--random_input_len=16", "--random_output_len=4", "--repeats=1",
               f"--compile_cache_dir={CACHE}", f"--json_out={tmp_path}/o.json", f"--md_out={tmp_path}/o.md")
    result = json.loads((tmp_path / "o.json").read_text())
    for side in ("offline", "http"):
        m = result["median"][side]
        assert (m["completed"], m["failed"], m["total_output_tokens"]) == (3, 0, 12)
    assert result["http_cost"]["ttft_mean_ms"] == pytest.approx(
        result["median"]["http"]["ttft_mean_ms"] - result["median"]["offline"]["ttft_mean_ms"])
    assert (tmp_path / "o.md").read_text().startswith("| metric | offline | HTTP | HTTP - offline |")
