"""KV residency of a live server over a benchmark run, read from its ``/metrics`` before and after.

Counters and histogram sums/counts are differenced, so the numbers cover the
run only; a server that does not export jaxpaged's KV metrics (or cannot be
reached) gives None, and the benchmark goes on without them.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

_PREFIX = "jaxpaged:"
_HISTOGRAMS = ("kv_block_lifetime_seconds", "kv_block_idle_before_evict_seconds", "kv_block_reuse_gap_seconds")


def scrape_kv_metrics(base_url: str, *, timeout_s: float = 10.0) -> dict[str, float] | None:
    """The server's KV residency samples now, keyed ``name`` or ``name{label}``; None if it exports none."""
    try:
        response = httpx.get(f"{base_url}/metrics", timeout=timeout_s, trust_env=False)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    values = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            name = s.name.removeprefix(_PREFIX)
            if name.startswith("kv_cache_evictions_by_reason_total"):
                values[f"evictions:{s.labels['reason']}"] = s.value
            elif name.startswith("prefix_cache_tier_hits_total"):
                values[f"tier_hit_tokens:{s.labels['tier']}"] = s.value
            elif name == "kv_cache_pinned_blocks":
                values["pinned_blocks"] = s.value
            elif any(name in (f"{h}_sum", f"{h}_count") for h in _HISTOGRAMS):
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
    for h in _HISTOGRAMS:
        count = diff.get(f"{h}_count", 0.0)
        out[h.removeprefix("kv_block_")] = {"count": count,
                                            "mean_s": diff.get(f"{h}_sum", 0.0) / count if count else None}
    return out
