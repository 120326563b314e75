"""``jaxpaged bench disagg``: colocated against one prefill + one decode process, and the transports' costs.

`run_deployment` warms a deployment up on other prompts until no new step shape compiles (the shapes still
compiled while timed are counted: a disaggregated engine sees other shapes than a colocated one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import sys
import time
from collections.abc import Sequence

import numpy as np

from jaxpaged.bench.online.datasets import BenchRequest, random_requests
from jaxpaged.bench.online.online_client import RequestResult, run_requests
from jaxpaged.bench.online.online_metrics import request_tpot
from jaxpaged.bench.online.server_process import ServerProcess, free_port
from jaxpaged.bench.options import option
from jaxpaged.report import markdown_table

PROXY_COMMAND = (sys.executable, "-m", "jaxpaged", "proxy")
STEP_SHAPE_LOG = "core INFO step shape "  # the runner logs each step shape it compiles (or loads from the cache)


@dataclasses.dataclass(frozen=True)
class DisaggBenchOptions:
    """The engines' KV pool, the transports, and which parts run."""

    kv_budget_tokens: int = option(16384, "each engine's KV pool in tokens", at_least=1)
    transports: tuple[str, ...] = option(("zmq", "jax"), "transports to measure (zmq, jax)", choices=["zmq", "jax"])
    transport_blocks: int = option(256, "blocks in the bandwidth pull", at_least=1)
    repeats: int = option(20, "pulls per transport measurement (medians)", at_least=1)
    max_warmup_runs: int = option(4, "warm-up runs at most per deployment (each until a run compiles no new step "
                                     "shape)", at_least=1)
    skip_serving: bool = option(False, "measure the transports only")
    skip_transports: bool = option(False, "measure the deployments only")


@dataclasses.dataclass(frozen=True)
class DisaggWorkload:
    """Running decodes sent at t=0, long prompts arriving every ``long_interval_s`` from ``long_start_s``."""

    num_decodes: int = option(4, "running decodes sent at the start", at_least=1)
    decode_prompt_len: int = 32
    decode_output_len: int = option(128, "tokens each running decode generates", at_least=2)
    num_long: int = option(4, "long prompts arriving while the decodes run", at_least=1)
    long_prompt_len: int = option(1024, "tokens of each long prompt", at_least=1)
    long_output_len: int = 16
    long_start_s: float = 1.0
    long_interval_s: float = option(1.5, "seconds between long prompts", at_least=0)
    seed: int = 0

    def requests(self) -> tuple[list[BenchRequest], list[float]]:
        """The requests (decodes first) and their arrival offsets."""
        decodes = random_requests(self.num_decodes, input_len=self.decode_prompt_len,
                                  output_len=self.decode_output_len, seed=self.seed, name="decode")
        longs = random_requests(self.num_long, input_len=self.long_prompt_len, output_len=self.long_output_len,
                                seed=self.seed + 1, name="long")
        offsets = [0.0] * len(decodes) + [self.long_start_s + i * self.long_interval_s for i in range(len(longs))]
        return decodes + longs, offsets


def class_metrics(results: Sequence[RequestResult], prefix: str) -> dict[str, float]:
    """TTFT and TPOT p50/p99 (ms), the worst inter-token gap (ms) and failures of the requests named ``prefix-*``."""
    chosen = [r for r in results if r.request_id.startswith(prefix)]
    ok = [r for r in chosen if r.success]
    ttft = [r.ttft for r in ok]
    tpot = [t for r in ok if (t := request_tpot(r)) is not None]
    gaps = [g for r in ok for g in r.itl]

    def pct(values, p):
        return float(np.percentile(np.asarray(values) * 1e3, p)) if values else float("nan")

    return {"ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99), "tpot_p50_ms": pct(tpot, 50),
            "tpot_p99_ms": pct(tpot, 99), "max_itl_ms": pct(gaps, 100), "failed": len(chosen) - len(ok),
            "cached_tokens": sum(r.cached_tokens or 0 for r in ok)}


def run_disagg(o: DisaggBenchOptions, workload: DisaggWorkload, model: str, max_model_len: int) -> tuple[dict, str]:
    """The deployments (colocated, then one prefill + one decode server per transport) and the transports' pulls
    of ``model``'s KV blocks, as ``o`` asks; the result and its tables."""
    from jaxpaged.checkpoint import model_config
    from jaxpaged.engine import EngineConfig
    from jaxpaged.kv_pool.pool import kv_dtype_from_name
    serving = [run_deployment("colocated" if t is None else f"1 prefill + 1 decode ({t})", model, workload,
                              transport=t, kv_budget_tokens=o.kv_budget_tokens, max_warmup_runs=o.max_warmup_runs,
                              max_model_len=max_model_len)
               for t in ([] if o.skip_serving else [None, *o.transports])]
    config = model_config(model)
    dtype = str(kv_dtype_from_name("auto", config.dtype))
    shape = (2, config.num_layers, config.num_kv_heads, EngineConfig().block_size, config.head_dim)
    transports = [] if o.skip_transports else [
        measure_transport(t, shape, dtype, num_blocks=o.transport_blocks, repeats=o.repeats) for t in o.transports]
    result = {"serving": serving, "transports": transports, "block_shape": list(shape), "kv_dtype": dtype}
    return result, disagg_table(serving, transports)


def run_deployment(name: str, model: str, workload: DisaggWorkload, *, kv_budget_tokens: int,
                   max_model_len: int, transport: str | None = None, max_warmup_runs: int = 4) -> dict:
    """Start one ``jaxpaged serve`` (``transport`` None) or a prefill and a decode one behind ``jaxpaged proxy``,
    run the workload on other prompts (warm-up), then timed, and stop them; TTFT, TPOT, the worst gap per class."""
    requests, offsets = workload.requests()
    base = [f"--model={model}", f"--kv_budget_tokens={kv_budget_tokens}", f"--max_model_len={max_model_len}",
            "--api_server_count=1"]
    with contextlib.ExitStack() as stack:  # stopped in reverse: the proxy, then the servers
        def start(args: list[str], **kwargs) -> ServerProcess:
            return stack.enter_context(ServerProcess(args, **kwargs))

        if transport is None:
            servers = [start(base)]
            url = servers[0].base_url
        else:
            kv_address = f"tcp://127.0.0.1:{free_port()}"
            servers = [start(base + ["--kv_role=prefill", f"--kv_listen={kv_address}", f"--kv_transport={transport}"]),
                       start(base + ["--kv_role=decode", f"--kv_peers={kv_address}", f"--kv_transport={transport}"])]
            url = start([f"--prefill={servers[0].base_url}", f"--decode={servers[1].base_url}"],
                        command=PROXY_COMMAND, startup_timeout_s=60).base_url
        warmup_runs = _warm_up(url, model, workload, servers, max_warmup_runs)
        compiled = _step_shapes(servers)
        results, duration = run_requests(url, model, requests, offsets)
        compiles = _step_shapes(servers) - compiled
    return {"deployment": name, "duration_s": duration, "warmup_runs": warmup_runs, "compiles": compiles,
            "long": class_metrics(results, "long-"), "decode": class_metrics(results, "decode-")}


def _warm_up(url: str, model: str, workload: DisaggWorkload, servers: Sequence[ServerProcess],
             max_runs: int) -> int:
    """The workload on other prompts until a run compiles no new step shape (at most ``max_runs`` runs)."""
    for run in range(1, max_runs + 1):
        before = _step_shapes(servers)
        warmup, warmup_offsets = dataclasses.replace(workload, seed=workload.seed + 1000 * run).requests()
        run_requests(url, model, warmup, warmup_offsets)
        if not _step_shapes(servers):  # every engine logs each shape it compiles or loads: none means no log
            raise RuntimeError("the servers logged no step shape: their engine cores' INFO logs are missing, "
                               "so compiles cannot be counted")
        if _step_shapes(servers) == before:
            break
    return run


def _step_shapes(servers: Sequence[ServerProcess]) -> int:
    """Step shapes the servers' engines have compiled so far (counted in their logs)."""
    return sum(server.log_path.read_text(errors="replace").count(STEP_SHAPE_LOG) for server in servers)


def _block_server(listen: str, transport: str, block_shape, dtype: str, num_blocks: int, ready) -> None:
    """Child process: an outbox of random blocks served on ``listen`` until killed."""
    from jaxpaged.kv_transfer import KVBlockBatch, KVOutbox
    from jaxpaged.kv_transfer.transport import KVBlockServer
    rng = np.random.default_rng(0)
    outbox = KVOutbox(num_blocks)
    for i in range(num_blocks):
        outbox.put(i.to_bytes(32, "little"), rng.standard_normal(block_shape).astype(dtype))

    def lookup(keys):
        found = outbox.get_many(keys)
        return KVBlockBatch.from_blocks(b"bench", [k for k, _ in found], [b for _, b in found], np.dtype(dtype),
                                        tuple(block_shape))

    KVBlockServer(listen, lookup, transport)
    ready.set()
    while True:
        time.sleep(1)


def measure_transport(transport: str, block_shape: Sequence[int], dtype: str, *, num_blocks: int,
                      repeats: int) -> dict:
    """Per-request overhead (median ms to pull 1 block) and bandwidth (MB/s pulling ``num_blocks``) of one
    transport between two processes; each pull's batch is checked (sizes and digest)."""
    from jaxpaged.kv_transfer.transport import KVBlockClient
    listen = f"tcp://127.0.0.1:{free_port()}"
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=_block_server, args=(listen, transport, tuple(block_shape), dtype,
                                                        num_blocks, ready), daemon=True)
    child.start()
    try:
        if not ready.wait(120):
            raise RuntimeError(f"the {transport} block server did not start")
        client = KVBlockClient(timeout_s=60.0)
        keys = [i.to_bytes(32, "little") for i in range(num_blocks)]

        def timed(wanted):
            start = time.perf_counter()
            batch = client.pull(listen, wanted)
            batch.check(b"bench", np.dtype(dtype), tuple(block_shape))
            return time.perf_counter() - start, batch.num_bytes

        timed(keys[:1]), timed(keys)  # connect and warm up
        one = [timed(keys[:1])[0] for _ in range(repeats)]
        many = [timed(keys) for _ in range(repeats)]
    finally:
        child.kill()
        child.join()
    seconds = float(np.median([s for s, _ in many]))
    return {"transport": transport, "one_block_ms": float(np.median(one)) * 1e3,
            "batch_blocks": num_blocks, "batch_bytes": many[0][1], "batch_ms": seconds * 1e3,
            "bandwidth_mb_s": many[0][1] / seconds / 1e6}


def disagg_table(serving: Sequence[dict], transports: Sequence[dict]) -> str:
    """Two Markdown tables: the deployments side by side, then the transports."""
    rows = []
    for run in serving:
        for cls in ("long", "decode"):
            m = run[cls]
            rows.append([run["deployment"], cls, f"{m['ttft_p50_ms']:.0f} / {m['ttft_p99_ms']:.0f}",
                         f"{m['tpot_p50_ms']:.1f} / {m['tpot_p99_ms']:.1f}", f"{m['max_itl_ms']:.0f}",
                         m["cached_tokens"], m["failed"], run["compiles"]])
    serving_table = markdown_table(["deployment", "requests", "TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)",
                                    "worst gap (ms)", "cached prompt tokens", "failed",
                                    "step shapes compiled while timed"], rows)
    transport_rows = [[t["transport"], f"{t['one_block_ms']:.2f}", t["batch_blocks"],
                       f"{t['batch_bytes'] / 1e6:.1f}", f"{t['batch_ms']:.1f}", f"{t['bandwidth_mb_s']:.0f}"]
                      for t in transports]
    transport_table = markdown_table(["transport", "1-block pull (ms)", "batch (blocks)", "batch (MB)",
                                      "batch pull (ms)", "bandwidth (MB/s)"], transport_rows)
    return serving_table + "\n\n" + transport_table
