"""Routing policies over engine replicas on Ray Serve, side by side on one cluster per replica count.

On each ``jaxpaged serve --data_parallel_size=N`` (its debug endpoints on), every policy in turn gets the
ingress (``POST /debug/routing_policy``) and the same requests at the same arrivals, from reset prefix caches,
after an untimed warm-up run per policy (a policy's cache hits give its own prefill shapes); the replicas
share a persistent compile cache. docs/benchmarks/replicas.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import httpx

from jaxpaged import compile_cache
from jaxpaged.bench.online.datasets import BenchRequest, arrival_offsets, prefix_repetition_requests
from jaxpaged.bench.online.online_client import RequestResult, fetch_model_name, run_requests
from jaxpaged.bench.online.online_metrics import compute_metrics
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.bench.options import option
from jaxpaged.report import metrics_table

POLICY_ORDER = ("prefix_aware", "round_robin", "least_loaded")
# Each replica's XLA runs single-threaded: the replicas, not one replica's threads, share the cores.
REPLICA_ENV = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclasses.dataclass(frozen=True)
class ReplicasOptions:
    """The clusters and policies compared, the shared-prefix requests, their arrivals, each replica's KV pool."""

    replicas: tuple[int, ...] = option((2, 4), "replica counts, one cluster each", at_least=1)
    policies: tuple[str, ...] = option(tuple(POLICY_ORDER), "routing policies to compare", choices=POLICY_ORDER)
    num_prefixes: int = option(8, "shared prefixes", at_least=1)
    prefix_len: int = option(512, "tokens per shared prefix", at_least=1)
    suffix_len: int = option(128, "tokens of each request's own suffix", at_least=1)
    output_len: int = option(16, "tokens generated per request (ignore_eos)", at_least=1)
    num_requests: int = option(64, "requests per policy run", at_least=1)
    warmup_requests: int = option(32, "untimed run per policy first on each cluster: the first N requests "
                                      "(compiles)", at_least=0)
    request_rate: float = option(2.0, "Poisson arrival rate (requests/s)", at_least=1)
    max_concurrency: int | None = option(None, "cap on requests in flight (default: none)", at_least=1)
    kv_budget_tokens: int = option(3072, "KV pool of each replica, in tokens", at_least=1)
    seed: int = option(0, "workload and arrival seed", at_least=0)


def hit_rate(results: Sequence[RequestResult]) -> float:
    """Cached prompt tokens / prompt tokens over the successful requests."""
    done = [r for r in results if r.success]
    prompt = sum(r.prompt_len for r in done)
    return sum(r.cached_tokens or 0 for r in done) / prompt if prompt else float("nan")


def routed_counts(base_url: str) -> dict[str, int]:
    """Requests routed to each live replica so far (``/debug/replicas``)."""
    rows = httpx.get(base_url + "/debug/replicas", timeout=120, trust_env=False).json()["replicas"]
    return {row["replica_id"]: row["routed_requests"] or 0 for row in rows}


def prepare(base_url: str, policy: str) -> None:
    """Route with ``policy`` from now on, starting from empty prefix caches."""
    for path, body in (("/debug/routing_policy", {"policy": policy}), ("/reset_prefix_cache", None)):
        response = httpx.post(base_url + path, json=body, timeout=120, trust_env=False)
        if response.status_code != 200:
            raise RuntimeError(f"POST {path} answered {response.status_code}: {response.text}")


def run_policies(serve_args: Sequence[str], requests: Sequence[BenchRequest], offsets: Sequence[float], *,
                 policies: Sequence[str] = POLICY_ORDER, max_concurrency: int | None = None,
                 env: Mapping[str, str] | None = None, num_warmup: int = 0) -> dict[str, dict]:
    """Start the replicas once, run the first ``num_warmup`` requests untimed under each policy (its hits give
    its own step shapes to compile), then ``requests`` under each policy; metrics per policy."""
    summaries = {}
    with ServerProcess(["--enable_debug_endpoints", *serve_args], env=env, startup_timeout_s=600) as server:
        base = server.base_url
        model = fetch_model_name(base)
        for policy in policies if num_warmup else ():
            prepare(base, policy)
            run_requests(base, model, requests[:num_warmup], offsets[:num_warmup], max_concurrency=max_concurrency)
        for policy in policies:
            prepare(base, policy)
            before = routed_counts(base)
            results, duration = run_requests(base, model, requests, offsets, max_concurrency=max_concurrency)
            after = routed_counts(base)
            metrics = compute_metrics(results, duration)
            spread = sorted((after.get(r, 0) - before.get(r, 0) for r in after), reverse=True)
            failures = [r.error for r in results if not r.success]
            summaries[policy] = {**metrics, "prefix_hit_rate": hit_rate(results), "requests_per_replica": spread,
                                 "first_error": failures[0] if failures else ""}
    return summaries


ROWS = (("prefix hit rate", "prefix_hit_rate", "{:.1%}"),
        ("TTFT p50 (ms)", "ttft_median_ms", "{:.0f}"),
        ("TTFT p99 (ms)", "ttft_p99_ms", "{:.0f}"),
        ("E2E latency p50 (ms)", "e2el_median_ms", "{:.0f}"),
        ("throughput (req/s)", "request_throughput", "{:.2f}"),
        ("total token throughput (tok/s)", "total_token_throughput", "{:.0f}"),
        ("failed requests", "failed", "{:.0f}"))


def markdown_table(by_replicas: Mapping[int, Mapping[str, Mapping]]) -> str:
    """One column per (replica count, policy), one row per metric, plus the requests each replica got."""
    columns = {f"{n} replicas, {p}": run for n, runs in by_replicas.items() for p, run in runs.items()}
    per_replica = ["/".join(str(c) for c in run["requests_per_replica"]) for run in columns.values()]
    return metrics_table(columns, ROWS, [["requests per replica", *per_replica]]) + "\n"


def replica_env(compile_cache_dir: str | None = None, xla_flags: str | None = None) -> dict[str, str]:
    """`REPLICA_ENV` after ``xla_flags`` (default: this process's ``XLA_FLAGS``), with the persistent compile
    cache ``compile_cache_dir`` resolves to (`compile_cache.child_env`: "auto", a path, or ''/None = off)."""
    xla_flags = os.environ.get("XLA_FLAGS") if xla_flags is None else xla_flags
    env = {**REPLICA_ENV, "XLA_FLAGS": " ".join(filter(None, [xla_flags, REPLICA_ENV["XLA_FLAGS"]]))}
    return env | compile_cache.child_env(compile_cache_dir)  # '' = off in every replica


def run_replica_counts(o: ReplicasOptions, model: str, *, max_num_batched_tokens: int,
                       compile_cache_dir: str | None = None) -> dict[int, dict]:
    """`run_policies` on one ``jaxpaged serve --data_parallel_size=N`` cluster per N in ``o.replicas``, every
    replica's engine ``model`` with ``max_num_batched_tokens``, sharing the compile cache ``compile_cache_dir``."""
    requests = prefix_repetition_requests(o.num_requests, prefix_len=o.prefix_len, suffix_len=o.suffix_len,
                                          num_prefixes=o.num_prefixes, output_len=o.output_len, seed=o.seed)
    offsets = arrival_offsets(len(requests), o.request_rate, seed=o.seed)
    env = replica_env(compile_cache_dir)
    results = {}
    for n in o.replicas:
        serve_args = [f"--model={model}", f"--data_parallel_size={n}", f"--kv_budget_tokens={o.kv_budget_tokens}",
                      f"--max_model_len={o.prefix_len + o.suffix_len + o.output_len}",
                      f"--max_num_batched_tokens={max_num_batched_tokens}", "--max_num_seqs=64"]
        results[n] = run_policies(serve_args, requests, offsets, policies=o.policies, max_concurrency=o.max_concurrency,
                                  env=env, num_warmup=min(o.warmup_requests, len(requests)))
    return results
