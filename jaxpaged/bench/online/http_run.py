"""``jaxpaged bench serving --backend=http``: one request set sent to a running server, and what it measured.

`RequestSet` names the requests (a jaxpaged workload or trace, ``random``, ``prefix_repetition`` or
``sharegpt``, as ``vllm bench serve --dataset-name``), `http_requests` builds them, `run_http_benchmark` sends
them and adds the server's KV residency over the run (its ``/metrics`` differenced) and the device-busy
fraction of a simulated device to the vllm-bench-serve metrics.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tqdm.auto import tqdm

from jaxpaged.bench.offline.serving_workload import ServingWorkload
from jaxpaged.bench.online.datasets import (PROMPT_FORMATS, BenchRequest, arrival_offsets, from_workload,
                                            load_bench_tokenizer, prefix_repetition_requests, random_requests,
                                            sharegpt_requests, with_prompt_format)
from jaxpaged.bench.online.online_client import fetch_metric, fetch_model_name, run_requests
from jaxpaged.bench.online.online_metrics import compute_metrics
from jaxpaged.bench.options import option
from jaxpaged.sim.workloads import WorkloadRequest

DATASETS = ("workload", "random", "prefix_repetition", "sharegpt")
# a simulated device (jaxpaged serve --device=simulated) counts the seconds it spent in steps
DEVICE_BUSY_METRIC = "jaxpaged:device_busy_seconds_total"
RESIDENCY_HISTOGRAMS = ("kv_block_lifetime_seconds", "kv_block_idle_before_evict_seconds",
                        "kv_block_reuse_gap_seconds")


@dataclasses.dataclass(frozen=True)
class RequestSet:
    """Which requests to send: the dataset and its lengths (the ``random_*``, ``prefix_*`` and ShareGPT settings)."""

    dataset_name: str = option("workload", "request set: a jaxpaged --workload, random, prefix_repetition or "
                                           "sharegpt", choices=DATASETS)
    dataset_path: str | None = option(None, "ShareGPT-format JSON file (--dataset_name=sharegpt)")
    prompt_format: str | None = option(None, "send prompts as token ids or text (default: as the dataset has them)",
                                       choices=PROMPT_FORMATS)
    random_input_len: int = option(1024, "prompt tokens (random)", at_least=1)
    random_output_len: int = option(128, "generated tokens (random)", at_least=1)
    random_range_ratio: float = option(0.0, "lengths vary uniformly within +- this fraction (random)",
                                       check="fraction")
    prefix_repetition_prefix_len: int = option(256, "shared prefix tokens (prefix_repetition)", at_least=1)
    prefix_repetition_suffix_len: int = option(256, "unique suffix tokens (prefix_repetition)", at_least=1)
    prefix_repetition_num_prefixes: int = option(10, "distinct prefixes (prefix_repetition)", at_least=1)
    prefix_repetition_output_len: int = option(128, "generated tokens (prefix_repetition)", at_least=1)
    sharegpt_output_len: int | None = option(None, "generated tokens per ShareGPT request (default: its reply's "
                                                   "length)", at_least=1)
    tokenizer: str | None = option(None, "config name or checkpoint directory whose tokenizer measures text "
                                         "prompts (default: --model)")


@dataclasses.dataclass(frozen=True)
class HttpDriver:
    """Which server gets the requests, and how they are sent."""

    base_url: str = option("http://127.0.0.1:8000", "server to drive (--backend=http)")
    served_model_name: str | None = option(None, "model name sent in requests (default: the first of GET "
                                                 "/v1/models)")
    burstiness: float = option(1.0, "gamma shape of inter-arrival gaps: 1 = Poisson, < 1 burstier",
                               check="positive_number")
    max_concurrency: int | None = option(None, "most requests in flight (default: unlimited)", at_least=1)
    ignore_eos: bool = option(True, "generate exactly the requested output length")
    request_timeout_s: float = option(600.0, "give up on a request after this long", check="positive_number")


def http_requests(workload: ServingWorkload, request_set: RequestSet, driver: HttpDriver, name: str,
                  model: str) -> tuple[list[BenchRequest], list[float]]:
    """The requests and their arrival offsets (seconds): ``workload.trace`` at its own (time-scaled) arrivals,
    else the jaxpaged workload ``name`` (``--dataset_name=workload``) or the dataset at ``request_rate`` and
    ``burstiness``; text is measured with ``request_set.tokenizer``, else ``model``'s (loaded only if needed)."""
    rs, n, seed = request_set, workload.num_requests, workload.seed
    tokenizer = None
    if rs.dataset_name == "sharegpt" or rs.prompt_format is not None:
        tokenizer = load_bench_tokenizer(rs.tokenizer or model)
    if workload.trace or rs.dataset_name == "workload":
        served = workload.requests(name)
        requests = from_workload(served)
    elif rs.dataset_name == "random":
        requests = random_requests(n, input_len=rs.random_input_len, output_len=rs.random_output_len,
                                   range_ratio=rs.random_range_ratio, seed=seed)
    elif rs.dataset_name == "prefix_repetition":
        requests = prefix_repetition_requests(
            n, prefix_len=rs.prefix_repetition_prefix_len, suffix_len=rs.prefix_repetition_suffix_len,
            num_prefixes=rs.prefix_repetition_num_prefixes, output_len=rs.prefix_repetition_output_len, seed=seed)
    else:
        if not rs.dataset_path:
            raise ValueError("--dataset_name=sharegpt needs --dataset_path")
        max_total_len = workload.max_model_len or 2048  # the longest prompt + output kept
        requests = sharegpt_requests(rs.dataset_path, n, tokenizer=tokenizer, seed=seed,
                                     output_len=rs.sharegpt_output_len, max_prompt_len=min(1024, max_total_len - 1),
                                     max_total_len=max_total_len)
    if rs.prompt_format is not None:
        requests = with_prompt_format(requests, rs.prompt_format, tokenizer)
    if workload.trace:
        return requests, [r.arrival_time for r in served]
    return requests, arrival_offsets(len(requests), workload.request_rate, burstiness=driver.burstiness,
                                     seed=seed).tolist()


def scrape_kv_metrics(base_url: str, *, timeout_s: float = 10.0) -> dict[str, float] | None:
    """The server's KV residency samples now, keyed ``name`` or ``kind:label``; None if it exports none (or
    cannot be reached: the benchmark goes on without them)."""
    try:
        response = httpx.get(f"{base_url}/metrics", timeout=timeout_s, trust_env=False)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    values = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            name = s.name.removeprefix("jaxpaged:")
            if name.startswith("kv_cache_evictions_by_reason_total"):
                values[f"evictions:{s.labels['reason']}"] = s.value
            elif name.startswith("prefix_cache_tier_hits_total"):
                values[f"tier_hit_tokens:{s.labels['tier']}"] = s.value
            elif name == "kv_cache_pinned_blocks":
                values["pinned_blocks"] = s.value
            elif any(name in (f"{h}_sum", f"{h}_count") for h in RESIDENCY_HISTOGRAMS):
                values[name] = s.value
    return values or None


def residency_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """What changed between two scrapes: evictions by reason, tier hit tokens, histogram counts and means;
    the pinned-blocks gauge as of ``after``."""
    if before is None or after is None:
        return None
    diff = {k: v - before.get(k, 0.0) for k, v in after.items()}
    out = {"evictions_by_reason": {k.split(":")[1]: v for k, v in diff.items() if k.startswith("evictions:")},
           "tier_hit_tokens": {k.split(":")[1]: v for k, v in diff.items() if k.startswith("tier_hit_tokens:")},
           "pinned_blocks": after.get("pinned_blocks", 0.0)}
    for h in RESIDENCY_HISTOGRAMS:
        count = diff.get(f"{h}_count", 0.0)
        out[h.removeprefix("kv_block_")] = {"count": count,
                                            "mean_s": diff.get(f"{h}_sum", 0.0) / count if count else None}
    return out


def run_http_benchmark(driver: HttpDriver, requests: Sequence[BenchRequest], offsets: Sequence[float], *,
                       goodput_slos: dict[str, float] | None = None, progress: bool = True) -> dict:
    """Send ``requests[i]`` at ``offsets[i]`` to the server at ``driver.base_url``; print its residency and
    failures. Returns the ``model`` sent, the run's ``metrics``, ``kv_residency`` and each request's record."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    base_url = driver.base_url
    model = driver.served_model_name or fetch_model_name(base_url)
    bar = tqdm(total=len(requests), desc="requests", disable=not progress)
    kv_before, busy_before = scrape_kv_metrics(base_url), fetch_metric(base_url, DEVICE_BUSY_METRIC)
    results, duration = run_requests(base_url, model, requests, offsets, max_concurrency=driver.max_concurrency,
                                     ignore_eos=driver.ignore_eos, timeout_s=driver.request_timeout_s,
                                     on_done=lambda _: bar.update())
    bar.close()
    kv_residency = residency_delta(kv_before, scrape_kv_metrics(base_url))
    busy_after = fetch_metric(base_url, DEVICE_BUSY_METRIC)
    metrics = compute_metrics(results, duration, goodput_slos=goodput_slos or {})
    if busy_before is not None and busy_after is not None:
        metrics["device_busy_fraction"] = (busy_after - busy_before) / duration
    if kv_residency is not None:
        print(f"server KV residency over the run: {kv_residency}")
    for r in results:
        if not r.success:
            print(f"failed: {r.request_id}: {r.error}")
    return {"model": model, "metrics": metrics, "kv_residency": kv_residency,
            "requests": [{k: v for k, v in dataclasses.asdict(r).items() if k != "text"} for r in results]}
