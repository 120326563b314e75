"""``jaxpaged bench startup``: the starts of this source tree (and an older one), or the padding costs, with the
date and the machine they were measured on (`jaxpaged.bench.offline.startup` does the measuring)."""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Sequence
from pathlib import Path

from jaxpaged.bench.offline import startup

THIS_TREE = Path(__file__).resolve().parents[3]  # the source tree this module is in


def run_startups(models: Sequence[str], *, baseline_root: str | None = None, kinds: Sequence[str] = startup.KINDS,
                 cache_states: Sequence[str] = startup.CACHE_STATES, repeats: int = 3, num_prompts: int = 16,
                 output_len: int = 32) -> tuple[dict, str]:
    """Every start of every model, this tree alternating with ``baseline_root`` when given: the result and table."""
    started = _now()
    versions = {"this": THIS_TREE} | ({"before": Path(baseline_root).resolve()} if baseline_root else {})
    cases = [startup.StartupCase(model, num_prompts=num_prompts, output_len=output_len) for model in models]
    result = startup.measure(versions, cases, kinds=kinds, cache_states=cache_states, repeats=repeats)
    result |= {"date": started, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
               "load_average": os.getloadavg(), "versions": {k: str(v) for k, v in versions.items()}}
    return result, startup.startup_table(result, "before" if baseline_root else None)


def padding_report(models: Sequence[str]) -> tuple[dict, str]:
    """Each model's step time at sizes padded further (`startup.padding_costs`): the result and table."""
    started = _now()
    rows = {model: startup.padding_costs(model) for model in models}
    return {"padding_costs": rows, "date": started}, startup.padding_table(rows)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()
