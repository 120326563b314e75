"""``jaxpaged bench http-overhead``: one request set offline (engine in-process) and over HTTP, side by side.

`serve_args` gives ``jaxpaged serve`` the offline engine's settings (model,
block size, KV budget, limits; prefix caching on); `offline_vs_http` warms both
sides up, then alternates timed runs, each side resetting its prefix cache
first, and reports medians (`offline_online.compare_offline_http`) and the
offline engine's compiles per run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import httpx

from jaxpaged.bench.offline.serving import ServingSetup, engine_config
from jaxpaged.bench.online.datasets import BenchRequest
from jaxpaged.bench.online.offline_online import compare_offline_http, offline_results
from jaxpaged.bench.online.online_client import fetch_model_name, run_requests
from jaxpaged.bench.online.online_metrics import compute_metrics
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.mathutils import cdiv


def http_overhead_setup(requests: Sequence[BenchRequest], *, block_size: int, kv_budget_tokens: int,
                        max_model_len: int | None, max_num_seqs: int, max_num_batched_tokens: int) -> ServingSetup:
    """The engine both sides run: ``kv_budget_tokens`` in blocks, and (unset) the longest request, in whole blocks."""
    longest = max(r.prompt_len + r.output_len for r in requests)
    return ServingSetup(num_blocks=kv_budget_tokens // block_size, block_size=block_size,
                        max_model_len=max_model_len or cdiv(longest, block_size) * block_size,
                        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)


def serve_args(model: str, setup: ServingSetup, extra: Sequence[str] = ()) -> list[str]:
    """``jaxpaged serve`` flags for the engine ``setup`` describes, then ``extra``."""
    return [f"--model={model}", f"--block_size={setup.block_size}",
            f"--kv_budget_tokens={setup.num_blocks * setup.block_size}", f"--max_model_len={setup.max_model_len}",
            f"--max_num_seqs={setup.max_num_seqs}", f"--max_num_batched_tokens={setup.max_num_batched_tokens}",
            *extra]


def offline_vs_http(model: str, setup: ServingSetup, requests: Sequence[BenchRequest], offsets: Sequence[float], *,
                    server_args: Sequence[str], start_server: bool = True, base_url: str | None = None,
                    env: dict[str, str] | None = None, ignore_eos: bool = True, timeout_s: float = 600.0,
                    repeats: int = 3, warmup_runs: int = 1) -> dict:
    """Run ``requests`` offline and over HTTP alternately; `compare_offline_http`'s result plus
    ``offline_compiles_per_run`` (warm-up runs first).

    ``start_server``: a ``jaxpaged serve`` with ``server_args`` on a free port;
    else the server at ``base_url``, which must run with those settings.
    """
    from jaxpaged.checkpoint import load_model
    from jaxpaged.engine import Engine
    engine = Engine(engine_config(setup, "prefix_on", model), load_model(model))
    with ServerProcess(server_args, env=env) if start_server else contextlib.nullcontext() as server:
        url = server.base_url if server is not None else base_url
        served = fetch_model_name(url)
        offline_compiles: list[int] = []

        def run_offline():
            engine.reset_prefix_cache()
            compiles = engine.num_compiles
            outcome = offline_results(engine, requests, offsets)
            offline_compiles.append(engine.num_compiles - compiles)
            return outcome

        def run_http():
            httpx.post(f"{url}/reset_prefix_cache", timeout=30, trust_env=False).raise_for_status()
            return run_requests(url, served, requests, offsets, ignore_eos=ignore_eos, timeout_s=timeout_s)

        result = compare_offline_http(run_offline, run_http, compute_metrics, repeats=repeats,
                                      warmup_runs=warmup_runs)
    print("offline compiles per run (warm-up runs first):", offline_compiles)
    return result | {"offline_compiles_per_run": offline_compiles}
