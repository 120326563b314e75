"""Prometheus metrics for an Engine, named like vLLM's (``jaxpaged:`` instead of ``vllm:``).

    metrics = attach_metrics(engine)           # registers itself as an engine stat logger
    metrics.serve(8000)                        # optional: HTTP /metrics on port 8000
    ...engine.step() ...
    metrics.snapshot()["jaxpaged:prefix_cache_hits_total"]

Each engine gets its own ``CollectorRegistry`` so several engines (and tests)
never clash in the process-wide default registry. Counters are fed the deltas
of the engine's cumulative counters after every step, so they always equal the
engine's own numbers. Token counts for the prefix cache are in tokens, as vLLM's.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

if TYPE_CHECKING:
    from jaxpaged.engine import Engine
    from jaxpaged.outputs import RequestOutput

PREFIX = "jaxpaged:"
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# block residency spans seconds to hours (vLLM's kv_block_* buckets, to 1 h)
_RESIDENCY_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
                      1800.0, 3600.0)
HIT_RATE_WINDOW_S = 60.0
TIERS = ("device", "host", "disk")


class WindowedHitRate:
    """Prefix-cache hit rate (tokens) over the last ``window_s`` seconds of a clock, from cumulative counts."""

    def __init__(self, window_s: float = HIT_RATE_WINDOW_S) -> None:
        """``window_s``: how far back the rate looks."""
        self.window_s = window_s
        # (time, queries, hits) whenever the totals change; the first point is always at or before
        # the window's start, so it is the base the window's counts are taken from
        self._points: collections.deque[tuple[float, int, int]] = collections.deque([(-np.inf, 0, 0)])

    def update(self, now: float, queries_total: int, hits_total: int) -> float:
        """Record the totals at ``now``; returns hits / queries over the window (0 with no queries)."""
        points = self._points
        if points[-1][1:] != (queries_total, hits_total):
            points.append((now, queries_total, hits_total))
        start = now - self.window_s
        while len(points) > 1 and points[1][0] <= start:
            points.popleft()
        _, q0, h0 = points[0]
        queries = queries_total - q0
        return (hits_total - h0) / queries if queries > 0 else 0.0


def tier_hit_tokens(engine: Engine) -> dict[str, int]:
    """Prompt tokens served by each KV tier so far: the device prefix cache, the host and disk tiers."""
    hits = {"device": engine.kv_stats().prefix_hits_tokens, "host": 0, "disk": 0}
    tiers = engine.tier_stats()
    if tiers is not None:
        hits["host"] = tiers.host_hits * engine.block_size
        hits["disk"] = tiers.disk_hits * engine.block_size
    return hits


def kv_residency_summary(engine: Engine) -> dict:
    """The KV residency numbers for a benchmark report: eviction policy, evictions by reason, pinned
    blocks, per-tier hit tokens, and the median / p90 / count of each sampled residency histogram."""
    stats = engine.kv_stats()
    out = {"eviction_policy": engine.eviction_policy,
           "evictions_by_reason": dict(stats.evictions_by_reason), "pinned_blocks": stats.num_pinned_blocks,
           "tier_hit_tokens": tier_hit_tokens(engine)}
    samples = engine.kv_residency_samples()
    if samples is not None:
        for name, values in samples.items():
            arr = np.asarray(values, dtype=float)
            out[f"{name}_s"] = {"count": int(arr.size),
                                "p50": float(np.median(arr)) if arr.size else None,
                                "p90": float(np.percentile(arr, 90)) if arr.size else None}
    return out


class EngineMetrics:
    """A stat logger (``logger(engine, outputs)``) that keeps Prometheus metrics current."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Create every metric in ``registry`` (a fresh one by default)."""
        self.registry = registry or CollectorRegistry()
        r = self.registry

        def gauge(name, doc):
            return Gauge(PREFIX + name, doc, registry=r)

        def counter(name, doc):
            return Counter(PREFIX + name, doc, registry=r)

        def histogram(name, doc, buckets):
            return Histogram(PREFIX + name, doc, buckets=buckets, registry=r)

        self.kv_cache_usage = gauge("kv_cache_usage_perc", "Fraction of KV blocks held by sequences (0-1).")
        self.running = gauge("num_requests_running", "Sequences running (holding KV blocks).")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting for admission.")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.")
        self.evictions = counter("kv_cache_evictions", "Cached KV blocks evicted for reuse.")
        self.preemptions = counter("num_preemptions", "Requests preempted (recompute).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens computed (cache hits excluded).")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        # speculative decoding, as vLLM names them
        self.spec_num_drafts = counter("spec_decode_num_drafts", "Sequences that verified draft tokens, per step.")
        self.spec_num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed and verified.")
        self.spec_num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.spec_accepted_per_pos = Counter(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted, by position among a step's drafts.",
                                             ["position"], registry=r)
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between output tokens.", _LATENCY_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS)
        self.device_busy_seconds = counter(
            "device_busy_seconds", "Seconds the (simulated) device spent in steps; only runners that count it.")
        self.iteration_tokens = histogram("iteration_tokens", "Tokens computed per engine step.", _TOKEN_BUCKETS)
        self.hit_rate_window = gauge("prefix_cache_hit_rate",
                                     f"Prefix-cache hit rate (tokens) over the last {HIT_RATE_WINDOW_S:g} s.")
        self.pinned_blocks = gauge("kv_cache_pinned_blocks",
                                   "Free cached KV blocks a pinned prefix keeps from eviction.")
        self.evictions_by_reason = Counter(PREFIX + "kv_cache_evictions_by_reason",
                                           "Cached KV blocks dropped, by reason (capacity, pinned, reset).",
                                           ["reason"], registry=r)
        self.tier_hits = Counter(PREFIX + "prefix_cache_tier_hits",
                                 "Prompt tokens served from a KV tier (device prefix cache, host, disk).",
                                 ["tier"], registry=r)
        self.kv_transfer_blocks = Counter(PREFIX + "kv_transfer_blocks",
                                          "KV connector blocks: saved for pullers, received from peers, or "
                                          "already held here (not pulled).", ["event"], registry=r)
        self.kv_transfer_bytes = counter("kv_transfer_received_bytes", "KV connector payload bytes received.")
        self.kv_transfer_pulls = Counter(PREFIX + "kv_transfer_pulls",
                                         "KV connector pulls: requests that waited for blocks, and pulls whose "
                                         "blocks were refused (identity, layout, digest) or that failed.",
                                         ["outcome"], registry=r)
        self.residency = {
            "lifetime": histogram("kv_block_lifetime_seconds",
                                  "Cached KV block lifetime, cached to evicted (sampled).", _RESIDENCY_BUCKETS),
            "idle_before_evict": histogram("kv_block_idle_before_evict_seconds",
                                           "Time from a cached block's last release to its eviction (sampled).",
                                           _RESIDENCY_BUCKETS),
            "reuse_gap": histogram("kv_block_reuse_gap_seconds",
                                   "Time between consecutive reuses of a cached block (sampled).",
                                   _RESIDENCY_BUCKETS),
        }
        for reason in ("capacity", "pinned", "reset"):
            self.evictions_by_reason.labels(reason)
        for tier in TIERS:
            self.tier_hits.labels(tier)
        for event in ("saved", "received", "already_held"):
            self.kv_transfer_blocks.labels(event)
        for outcome in ("requests", "refused", "failed"):
            self.kv_transfer_pulls.labels(outcome)
        self._window = WindowedHitRate()
        self._seen: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._last_step = 0

    def __call__(self, engine: Engine, outputs: list[RequestOutput]) -> None:
        """Update from the engine after one step; ``outputs`` are what the step returned."""
        kv, load = engine.kv_stats(), engine.load()
        self.kv_cache_usage.set(kv.usage)
        self.running.set(load.num_running)
        self.waiting.set(load.num_waiting)
        totals = {
            "prefix_queries": kv.prefix_queries_tokens,
            "prefix_hits": kv.prefix_hits_tokens,
            "evictions": kv.num_evictions,
            "preemptions": engine.num_preemptions,
            "prompt_tokens": engine.stats.prompt_tokens,
            "generation_tokens": engine.stats.generation_tokens,
            "spec_num_drafts": engine.stats.spec_num_drafts,
            "spec_num_draft_tokens": engine.stats.spec_num_draft_tokens,
            "spec_num_accepted_tokens": engine.stats.spec_num_accepted_tokens,
        }
        busy_s = engine.device_busy_s()  # the simulated devices count their busy time
        if busy_s is not None:
            totals["device_busy_seconds"] = busy_s
        for name, total in totals.items():
            delta = total - self._last.get(name, 0)
            if delta > 0:
                getattr(self, name).inc(delta)
            self._last[name] = total
        self._update_residency(engine, kv)
        if engine.kv_connector is not None:
            self._update_kv_transfer(engine.kv_connector.stats)
        if engine.stats.num_steps > self._last_step:  # a step that ran on the device
            self._last_step = engine.stats.num_steps
            self.iteration_tokens.observe(engine.stats.last_step_tokens)
        for out in outputs:
            if not out.finished:
                continue
            m = out.metrics
            if m.ttft is not None:
                self.ttft.observe(m.ttft)
            if m.e2e_latency is not None:
                self.e2e.observe(m.e2e_latency)
            for gap in m.inter_token_latencies:
                self.itl.observe(gap)

    def _update_kv_transfer(self, stats) -> None:
        """Feed the connector's cumulative counters (`jaxpaged.kv_transfer.TransferStats`) as deltas."""
        series = {("blocks", "saved"): stats.blocks_saved, ("blocks", "received"): stats.blocks_received,
                  ("blocks", "already_held"): stats.blocks_already_held, ("bytes", ""): stats.bytes_received,
                  ("pulls", "requests"): stats.loads, ("pulls", "refused"): stats.refused,
                  ("pulls", "failed"): stats.failed}
        for (kind, label), total in series.items():
            delta = total - self._seen.get(f"kv_transfer_{kind}_{label}", 0)
            if delta > 0:
                metric = {"blocks": self.kv_transfer_blocks, "pulls": self.kv_transfer_pulls}.get(kind)
                (metric.labels(label) if metric is not None else self.kv_transfer_bytes).inc(delta)
            self._seen[f"kv_transfer_{kind}_{label}"] = total

    def _update_residency(self, engine: Engine, kv) -> None:
        self.hit_rate_window.set(self._window.update(engine.clock(), kv.prefix_queries_tokens,
                                                     kv.prefix_hits_tokens))
        self.pinned_blocks.set(kv.num_pinned_blocks)
        labeled = [(self.evictions_by_reason, f"reason:{k}", k, v) for k, v in kv.evictions_by_reason.items()]
        labeled += [(self.tier_hits, f"tier:{k}", k, v) for k, v in tier_hit_tokens(engine).items()]
        labeled += [(self.spec_accepted_per_pos, f"position:{p}", str(p), v)
                    for p, v in enumerate(engine.stats.spec_accepted_per_position)]
        for metric, key, label, total in labeled:
            delta = total - self._last.get(key, 0)
            if delta > 0:
                metric.labels(label).inc(delta)
            self._last[key] = total
        samples = engine.kv_residency_samples()
        if samples is not None:
            for name, values in samples.items():
                seen = self._seen.get(name, 0)
                for value in values[seen:]:
                    self.residency[name].observe(value)
                self._seen[name] = len(values)

    def snapshot(self) -> dict[str, float]:
        """Every sample now, keyed by its exposition name (``..._total``, ``..._sum``, ``..._count``,
        bucket samples as ``name{le="x"}``); ``_created`` timestamps are left out."""
        values = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = sample.name
                if sample.labels:
                    key += "{" + ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())) + "}"
                values[key] = sample.value
        return values

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Serve this registry over HTTP at ``addr:port/metrics`` (a daemon thread); returns the server."""
        return start_http_server(port, addr=addr, registry=self.registry)


class PeriodicLogger:
    """Logs a one-line summary at most every ``interval_s`` seconds, as vLLM's LoggingStatLogger."""

    def __init__(self, interval_s: float = 5.0, *, log: Callable[[str], None] = logging.getLogger(__name__).info,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``log`` receives each line; ``clock`` is the time source."""
        self.interval_s = interval_s
        self.log = log
        self.clock = clock
        self._last_time = clock()
        self._last_prompt = 0
        self._last_generation = 0

    def __call__(self, engine: Engine, outputs: list[RequestOutput]) -> None:
        """Log when the interval has passed since the last line."""
        now = self.clock()
        elapsed = now - self._last_time
        if elapsed < self.interval_s:
            return
        self.log(self.format_line(engine, elapsed))
        self._last_time = now
        self._last_prompt = engine.stats.prompt_tokens
        self._last_generation = engine.stats.generation_tokens

    def format_line(self, engine: Engine, elapsed: float) -> str:
        """The summary line for the ``elapsed`` seconds since the previous one."""
        kv, load = engine.kv_stats(), engine.load()
        prompt_rate = (engine.stats.prompt_tokens - self._last_prompt) / elapsed if elapsed > 0 else 0.0
        gen_rate = (engine.stats.generation_tokens - self._last_generation) / elapsed if elapsed > 0 else 0.0
        return (f"Avg prompt throughput: {prompt_rate:.1f} tokens/s, "
                f"Avg generation throughput: {gen_rate:.1f} tokens/s, "
                f"Running: {load.num_running} reqs, Waiting: {load.num_waiting} reqs, "
                f"KV cache usage: {kv.usage * 100:.1f}%, Prefix cache hit rate: {kv.prefix_hit_rate * 100:.1f}%, "
                f"Preemptions: {engine.num_preemptions}")


def attach_metrics(engine: Engine, *, port: int | None = None, log_interval_s: float | None = None,
                   registry: CollectorRegistry | None = None) -> EngineMetrics:
    """Register Prometheus metrics (and, if ``log_interval_s``, the periodic log line) on ``engine``.

    ``port`` also serves them over HTTP. Returns the metrics; ``snapshot()`` reads them.
    """
    metrics = EngineMetrics(registry)
    engine.stat_loggers.append(metrics)
    if log_interval_s is not None:
        engine.stat_loggers.append(PeriodicLogger(log_interval_s, clock=engine.clock))
    if port is not None:
        metrics.serve(port)
    return metrics
