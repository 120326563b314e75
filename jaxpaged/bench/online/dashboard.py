"""The Grafana dashboard shipped in ``examples/grafana/``: its PromQL queries, as Prometheus would run them.

Grafana interpolates its own variables before a query reaches Prometheus;
``$__rate_interval`` is the only one the dashboard uses, and :func:`dashboard_queries`
replaces it the same way (with a fixed window) so a query can be parsed or sent
to Prometheus directly.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[3] / "examples" / "grafana" / "jaxpaged-kv-cache.json"


@dataclasses.dataclass(frozen=True)
class PanelQuery:
    """One target of one panel."""

    panel: str
    ref_id: str
    expr: str  # with Grafana's variables replaced


def dashboard_queries(path: str | Path = DASHBOARD, *, rate_interval: str = "1m") -> list[PanelQuery]:
    """Every panel target's PromQL, ``$__rate_interval`` replaced by ``rate_interval``."""
    dashboard = json.loads(Path(path).read_text())
    return [PanelQuery(panel["title"], target["refId"], target["expr"].replace("$__rate_interval", rate_interval))
            for panel in dashboard["panels"] for target in panel.get("targets", [])]
