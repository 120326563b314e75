"""``scripts/bench_serving.py --backend=http``: drive a running server with a request set and report.

The flags here choose the request set (``--dataset_name``), the arrival
process (``--request_rate`` from jaxpaged/cli/workload_flags.py, ``--burstiness``),
``--max_concurrency`` and the goodput SLOs; :func:`run_from_flags` sends the
requests (jaxpaged/bench/online/online_client.py), summarizes them
(jaxpaged/bench/online/online_metrics.py) and writes JSON and Markdown.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from absl import flags
from tqdm.auto import tqdm

from jaxpaged.cli import flag_checks
from jaxpaged.cli import workload_flags as bench_flags
from jaxpaged.bench.online.arrivals import arrival_offsets
from jaxpaged.bench.online.datasets import (
    PROMPT_FORMATS,
    BenchRequest,
    from_workload,
    load_bench_tokenizer,
    prefix_repetition_requests,
    random_requests,
    sharegpt_requests,
    with_prompt_format,
)
from jaxpaged.bench.online.online_client import fetch_metric, fetch_model_name, run_requests
from jaxpaged.bench.online.online_metrics import compute_metrics, parse_goodput
from jaxpaged.bench.online.online_report import online_markdown_table
from jaxpaged.bench.output import write_outputs
from jaxpaged.bench.online.server_residency import residency_delta, scrape_kv_metrics

DATASETS = ("workload", "random", "prefix_repetition", "sharegpt")
DEVICE_BUSY_METRIC = "jaxpaged:device_busy_seconds_total"

BASE_URL = flags.DEFINE_string("base_url", "http://127.0.0.1:8000", "server to drive (--backend=http)")
SERVED_MODEL = flags.DEFINE_string("served_model_name", None,
                                   "model name sent in requests (default: the first of GET /v1/models)")
TOKENIZER = flags.DEFINE_string("tokenizer", None,
                                "config name or checkpoint directory whose tokenizer measures text prompts "
                                "(default: --model)")
DATASET = flags.DEFINE_enum("dataset_name", "workload", DATASETS,
                            "request set: a jaxpaged --workload, random, prefix_repetition or sharegpt")
DATASET_PATH = flags.DEFINE_string("dataset_path", None, "ShareGPT-format JSON file (--dataset_name=sharegpt)")
PROMPT_FORMAT = flags.DEFINE_enum("prompt_format", None, PROMPT_FORMATS,
                                  "send prompts as token ids or text (default: as the dataset has them)")
RANDOM_INPUT = flags.DEFINE_integer("random_input_len", 1024, "prompt tokens (random)")
RANDOM_OUTPUT = flags.DEFINE_integer("random_output_len", 128, "generated tokens (random)")
RANDOM_RANGE = flags.DEFINE_float("random_range_ratio", 0.0, "lengths vary uniformly within +- this fraction (random)")
PREFIX_LEN = flags.DEFINE_integer("prefix_repetition_prefix_len", 256, "shared prefix tokens (prefix_repetition)")
SUFFIX_LEN = flags.DEFINE_integer("prefix_repetition_suffix_len", 256, "unique suffix tokens (prefix_repetition)")
NUM_PREFIXES = flags.DEFINE_integer("prefix_repetition_num_prefixes", 10, "distinct prefixes (prefix_repetition)")
PREFIX_OUTPUT = flags.DEFINE_integer("prefix_repetition_output_len", 128, "generated tokens (prefix_repetition)")
SHAREGPT_OUTPUT = flags.DEFINE_integer("sharegpt_output_len", None,
                                       "generated tokens per ShareGPT request (default: its reply's length)")
BURSTINESS = flags.DEFINE_float("burstiness", 1.0, "gamma shape of inter-arrival gaps: 1 = Poisson, < 1 burstier")
MAX_CONCURRENCY = flags.DEFINE_integer("max_concurrency", None, "most requests in flight (default: unlimited)")
GOODPUT = flags.DEFINE_multi_string("goodput", [], "SLOs in ms, e.g. --goodput=ttft:200,tpot:50 (or repeated)")
IGNORE_EOS = flags.DEFINE_boolean("ignore_eos", True, "generate exactly the requested output length")
TIMEOUT = flags.DEFINE_float("request_timeout_s", 600.0, "give up on a request after this long")
flags.DEFINE_alias("num_prompts", "num_requests")
flag_checks.positive("random_input_len", "random_output_len", "prefix_repetition_prefix_len",
                     "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes", "prefix_repetition_output_len",
                     "sharegpt_output_len", "max_concurrency")
flags.register_validator("random_range_ratio", lambda v: 0 <= v < 1, message="--random_range_ratio must be in [0, 1)")
flags.register_validator("burstiness", lambda v: 0 < v < float("inf"),
                         message="--burstiness must be a positive finite number")
flags.register_validator("request_timeout_s", lambda v: v > 0, message="--request_timeout_s must be positive")


def requests_from_flags(workload: str) -> list[BenchRequest]:
    """The request set the flags describe (``workload`` names the jaxpaged workload for ``--dataset_name=workload``).

    The tokenizer (``--tokenizer``, else ``--model``) is loaded only when text
    has to be measured or converted.
    """
    name, num, seed = DATASET.value, bench_flags.NUM_REQUESTS.value, bench_flags.SEED.value
    tokenizer = None
    if name == "sharegpt" or PROMPT_FORMAT.value is not None:
        tokenizer = load_bench_tokenizer(TOKENIZER.value or bench_flags.MODEL.value)
    if bench_flags.TRACE.value:
        requests = from_workload(bench_flags.trace_from_flags())
    elif name == "workload":
        requests = from_workload(bench_flags.workload_from_flags(workload))
    elif name == "random":
        requests = random_requests(num, input_len=RANDOM_INPUT.value, output_len=RANDOM_OUTPUT.value,
                                   range_ratio=RANDOM_RANGE.value, seed=seed)
    elif name == "prefix_repetition":
        requests = prefix_repetition_requests(num, prefix_len=PREFIX_LEN.value, suffix_len=SUFFIX_LEN.value,
                                              num_prefixes=NUM_PREFIXES.value, output_len=PREFIX_OUTPUT.value,
                                              seed=seed)
    else:
        if not DATASET_PATH.value:
            raise ValueError("--dataset_name=sharegpt needs --dataset_path")
        max_total = bench_flags.MAX_MODEL_LEN.value or 2048
        requests = sharegpt_requests(DATASET_PATH.value, num, tokenizer=tokenizer, seed=seed,
                                     output_len=SHAREGPT_OUTPUT.value, max_prompt_len=min(1024, max_total - 1),
                                     max_total_len=max_total)
    if PROMPT_FORMAT.value is not None:
        requests = with_prompt_format(requests, PROMPT_FORMAT.value, tokenizer)
    return requests


def offsets_from_flags(num_requests: int) -> list[float]:
    """Arrival offsets (seconds) from ``--request_rate``, ``--burstiness`` and ``--seed``."""
    return arrival_offsets(num_requests, bench_flags.REQUEST_RATE.value, burstiness=BURSTINESS.value,
                           seed=bench_flags.SEED.value).tolist()


def goodput_from_flags(extra_args: Sequence[str] = ()) -> dict[str, float]:
    """``--goodput`` SLOs; ``extra_args`` are leftover positional arguments, so ``--goodput ttft:1 tpot:2`` works."""
    if extra_args and not GOODPUT.value:
        raise ValueError(f"unexpected arguments {list(extra_args)}")
    return parse_goodput([*GOODPUT.value, *extra_args])


def run_from_flags(workload: str, *, extra_args: Sequence[str] = (), json_out: str | None = None,
                   md_out: str | None = None, progress: bool = True) -> dict:
    """Run the HTTP benchmark the flags describe against ``--base_url``; print, write and return the result."""
    slos = goodput_from_flags(extra_args)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    model = SERVED_MODEL.value or fetch_model_name(BASE_URL.value)
    requests = requests_from_flags(workload)
    if bench_flags.TRACE.value:  # the trace's own (time-scaled) arrivals
        offsets = [r.arrival_time for r in bench_flags.trace_from_flags()]
    else:
        offsets = offsets_from_flags(len(requests))
    bar = tqdm(total=len(requests), desc="requests", disable=not progress)
    kv_before = scrape_kv_metrics(BASE_URL.value)
    busy_before = fetch_metric(BASE_URL.value, DEVICE_BUSY_METRIC)
    results, duration = run_requests(BASE_URL.value, model, requests, offsets,
                                     max_concurrency=MAX_CONCURRENCY.value, ignore_eos=IGNORE_EOS.value,
                                     timeout_s=TIMEOUT.value, on_done=lambda _: bar.update())
    bar.close()
    kv_residency = residency_delta(kv_before, scrape_kv_metrics(BASE_URL.value))
    busy_after = fetch_metric(BASE_URL.value, DEVICE_BUSY_METRIC)
    metrics = compute_metrics(results, duration, goodput_slos=slos)
    if busy_before is not None and busy_after is not None and duration > 0:
        # a simulated device (serve.py --device=simulated) counts the seconds it spent in steps
        metrics["device_busy_fraction"] = (busy_after - busy_before) / duration
    table = online_markdown_table({"http": metrics})
    print(table)
    if kv_residency is not None:
        print(f"server KV residency over the run: {kv_residency}")
    for r in results:
        if not r.success:
            print(f"failed: {r.request_id}: {r.error}")
    result = {"backend": "http", "base_url": BASE_URL.value, "model": model, "dataset_name": "trace" if bench_flags.TRACE.value else DATASET.value,
              "trace": bench_flags.TRACE.value,
              "workload": workload if DATASET.value == "workload" else None, "num_requests": len(requests),
              "request_rate": bench_flags.REQUEST_RATE.value, "burstiness": BURSTINESS.value,
              "max_concurrency": MAX_CONCURRENCY.value, "goodput_slos_ms": slos, "metrics": metrics,
              "kv_residency": kv_residency,
              "requests": [{k: v for k, v in dataclasses.asdict(r).items() if k != "text"} for r in results]}
    write_outputs(result, table, json_out, md_out)
    return result
