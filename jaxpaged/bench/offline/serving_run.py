"""``jaxpaged bench serving`` (offline): `compare_modes` with live engine metrics and each mode's KV residency.

Every engine a run builds gets Prometheus metrics (`jaxpaged.metrics.attach_metrics`;
the first one serves ``metrics_port`` when given) and an optional periodic log
line; each mode's engine in the last run is kept so its KV residency (evictions
by reason, pinned blocks, tier hits, sampled lifetimes) is reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tqdm.auto import tqdm

from jaxpaged.bench.offline.report import markdown_table as modes_table
from jaxpaged.bench.offline.serving import MODES, ServingSetup, compare_modes
from jaxpaged.engine import EngineConfig
from jaxpaged.report import markdown_table
from jaxpaged.sim.workloads import WorkloadRequest


def mode_of(config: EngineConfig) -> str:
    """The `MODES` entry whose overrides ``config`` has."""
    return next(name for name, overrides in MODES.items()
                if all(getattr(config, key) == value for key, value in overrides.items()))


def serve_modes(model, setup: ServingSetup, requests: Sequence[WorkloadRequest], *, modes: Sequence[str],
                repeats: int = 1, metrics_port: int | None = None, log_interval_s: float | None = None,
                progress: bool = True, model_name: str | None = None) -> dict:
    """`compare_modes`'s result plus ``kv_residency``: per mode, `kv_residency_summary` of its last run's engine.
    ``model_name``: the checkpoint the engines load their tokenizer from (default: the config's name)."""
    from jaxpaged.metrics import attach_metrics, kv_residency_summary
    bar = tqdm(total=len(requests) * len(modes) * repeats, desc="requests", disable=not progress)
    port = iter([metrics_port])  # the HTTP server can bind once; it serves the first engine's registry
    last_engine = {}  # mode -> its engine in the last run

    def hook(engine):
        attach_metrics(engine, port=next(port, None), log_interval_s=log_interval_s)
        last_engine[mode_of(engine.config)] = engine

    result = compare_modes(model, setup, requests, modes=modes, repeats=repeats, on_finish=lambda _: bar.update(),
                           engine_hook=hook, model_name=model_name)
    bar.close()
    result["kv_residency"] = {mode: kv_residency_summary(e) for mode, e in last_engine.items()}
    return result


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
