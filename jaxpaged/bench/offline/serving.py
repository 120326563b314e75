"""The serving benchmark (``jaxpaged bench serving``, offline): one workload through several KV modes, side by side.

Modes share one model and one `TimedRunner` (so one pool and one compile cache), the same KV budget and the
same engine limits; only the KV manager differs. They run interleaved, repeat by repeat, so machine load hits
them alike.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

from tqdm.auto import tqdm

from jaxpaged.attention.backend import resolve_backend
from jaxpaged.bench.offline.driver import markdown_table as modes_table
from jaxpaged.bench.offline.driver import median_summary, mode_ratios, run_workload, summarize
from jaxpaged.bench.offline.timing import TimedRunner, alternate
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutput
from jaxpaged.report import markdown_table
from jaxpaged.runner import ModelRunner
from jaxpaged.sim.workloads import WorkloadRequest


# mode name -> EngineConfig overrides
MODES: dict[str, dict] = {
    "prefix_on": {"kv_layout": "paged", "enable_prefix_caching": True},
    "prefix_off": {"kv_layout": "paged", "enable_prefix_caching": False},
    "contiguous": {"kv_layout": "contiguous", "enable_prefix_caching": False},
}
# pairs (a, b) whose ratios a/b the report quotes
RATIO_PAIRS = (("prefix_on", "prefix_off"), ("prefix_on", "contiguous"), ("prefix_off", "contiguous"))


@dataclasses.dataclass(frozen=True)
class ServingSetup:
    """What every mode shares: KV budget in blocks, block size and engine limits (`EngineConfig` fields)."""

    num_blocks: int
    block_size: int = EngineConfig.block_size
    max_model_len: int = 1024
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    eviction_policy: str = "lru"
    kv_cache_metrics_sample: float = 0.0


def engine_config(setup: ServingSetup, mode: str, model_name: str) -> EngineConfig:
    """The EngineConfig of ``mode`` under ``setup``."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return EngineConfig(model=model_name, **dataclasses.asdict(setup), **MODES[mode])


def make_runner(model, setup: ServingSetup) -> TimedRunner:
    """One timed runner over a pool of ``setup.num_blocks`` blocks, shared by all modes."""
    return TimedRunner(ModelRunner(model, setup.num_blocks, setup.block_size, max_num_seqs=setup.max_num_seqs,
                                   backend=resolve_backend()))


def run_mode(model, runner: TimedRunner, setup: ServingSetup, mode: str, requests: Sequence[WorkloadRequest],
             *, on_finish: Callable[[RequestOutput], None] | None = None,
             engine_hook: Callable[[Engine], None] | None = None, model_name: str | None = None) -> dict[str, float]:
    """Run one mode on a fresh engine (fresh cache manager, shared runner), seen first by ``engine_hook``, and
    summarize it; the engine loads its tokenizer from ``model_name`` (default: the config's name)."""
    engine = Engine(engine_config(setup, mode, model_name or model.config.name), model, runner=runner,
                    clock=runner.clock)
    if engine_hook is not None:
        engine_hook(engine)
    compiles, compile_s = runner.num_compiles, runner.compile_s
    record = run_workload(engine, requests, on_finish=on_finish)
    return summarize(record, num_compiles=runner.num_compiles - compiles, compile_s=runner.compile_s - compile_s)


def serve_modes(model, setup: ServingSetup, requests: Sequence[WorkloadRequest], *, modes: Sequence[str],
                repeats: int = 1, metrics_port: int | None = None, log_interval_s: float | None = None,
                progress: bool = True, model_name: str | None = None) -> dict:
    """Every mode once untimed (``warmup``: the timed runs then find their step shapes compiled; a compile left
    in a timed run is excluded from its clock and counted), then ``repeats`` times interleaved, Prometheus
    metrics on every engine: per-run, median and ratio results, and per mode ``kv_residency``
    (`kv_residency_summary` of its last run's engine). ``model_name``: see `run_mode`."""
    from jaxpaged.metrics import attach_metrics, kv_residency_summary
    runner = make_runner(model, setup)
    warm = {mode: run_mode(model, runner, setup, mode, requests, model_name=model_name) for mode in modes}
    bar = tqdm(total=len(requests) * len(modes) * repeats, desc="requests", disable=not progress)
    port = iter([metrics_port])  # the HTTP server can bind once; it serves the first engine's registry
    last_engine = {}  # mode -> its engine in the last run

    def run(mode: str) -> dict[str, float]:
        def hook(engine: Engine) -> None:
            attach_metrics(engine, port=next(port, None), log_interval_s=log_interval_s)
            last_engine[mode] = engine
        return run_mode(model, runner, setup, mode, requests, on_finish=lambda _: bar.update(), engine_hook=hook,
                        model_name=model_name)

    runs = alternate({mode: functools.partial(run, mode) for mode in modes}, repeats)
    bar.close()
    medians = {mode: median_summary(r) for mode, r in runs.items()}
    return {"warmup": warm, "runs": runs, "median": medians, "ratios": mode_ratios(medians, RATIO_PAIRS),
            "kv_residency": {mode: kv_residency_summary(e) for mode, e in last_engine.items()}}


def residency_table(residency: Mapping[str, Mapping]) -> str:
    """KV residency of each mode's last run: evictions by reason, pinned blocks, tier hits, sampled lifetimes."""
    rows = []
    for mode, r in residency.items():
        ev, hits = r["evictions_by_reason"], r["tier_hit_tokens"]
        cells = [f"{r[k]['p50']:.3f}" if r.get(k, {}).get("count") else "-"
                 for k in ("lifetime_s", "idle_before_evict_s", "reuse_gap_s")]
        rows.append([mode, r["eviction_policy"], f"{ev.get('capacity', 0)}/{ev.get('pinned', 0)}/{ev.get('reset', 0)}",
                     r["pinned_blocks"], f"{hits['device']}/{hits['host']}/{hits['disk']}", *cells])
    return markdown_table(["KV residency (last run)", "policy", "evictions capacity/pinned/reset", "pinned blocks",
                           "hit tokens device/host/disk", "lifetime p50 (s)", "idle before evict p50 (s)",
                           "reuse gap p50 (s)"], rows, align="llrrrrrr")


def serving_tables(result: Mapping) -> str:
    """The metrics-by-mode table, the ratios, and the KV residency table."""
    return modes_table(result["median"], result["ratios"]) + "\n\n" + residency_table(result["kv_residency"])
