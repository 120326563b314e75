"""The shipped Grafana dashboard against a real Prometheus scraping a live jaxpaged server.

A query fails when Prometheus refuses it or it returns no series (`failed_queries`). Grafana's own
``$__rate_interval`` (the only variable the dashboard uses) becomes a fixed window, as Grafana would make it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from jaxpaged.bench.online.server_process import ChildProcess, ServerProcess, free_port
from jaxpaged.bench.options import option
from jaxpaged.report import markdown_table

DASHBOARD = Path(__file__).resolve().parents[3] / "examples" / "grafana" / "jaxpaged-kv-cache.json"
# a small KV pool, every block sampled: blocks are hit, evicted and pinned
SERVER_ARGS = ("--kv_budget_tokens=512", "--max_model_len=256", "--max_num_seqs=4",
               "--max_num_batched_tokens=256", "--kv_cache_metrics_sample=1")


@dataclasses.dataclass(frozen=True)
class PanelQuery:
    """One target of one panel (``expr`` with Grafana's variables replaced)."""

    panel: str
    ref_id: str
    expr: str


@dataclasses.dataclass(frozen=True)
class DashboardCheck:
    """What to check: the server's model, eviction policy and compile cache, the Prometheus binary, traffic and
    rate window."""

    model: str = "tiny"
    prometheus: str = option("prometheus", "the Prometheus binary")
    traffic_s: float = option(40.0, "seconds of traffic while Prometheus scrapes", at_least=1.0)
    rate_interval: str = option("30s", "what Grafana's $__rate_interval becomes")
    eviction_policy: str = "lru"
    compile_cache_dir: str = "auto"  # the server's EngineConfig.compile_cache_dir ('' = off)
    dashboard: Path = DASHBOARD


def dashboard_queries(path: str | Path = DASHBOARD, *, rate_interval: str = "1m") -> list[PanelQuery]:
    """Every panel target's PromQL, ``$__rate_interval`` replaced by ``rate_interval``."""
    dashboard = json.loads(Path(path).read_text())
    return [PanelQuery(panel["title"], target["refId"], target["expr"].replace("$__rate_interval", rate_interval))
            for panel in dashboard["panels"] for target in panel.get("targets", [])]


def traffic(base_url: str, model: str, seconds: float) -> int:
    """Shared-prefix requests mixed with never-seen ones (so blocks are hit, evicted and pinned); returns count."""
    deadline, n = time.monotonic() + seconds, 0
    with httpx.Client(base_url=base_url, timeout=120.0, trust_env=False) as client:
        client.post("/v1/cache/pin", json={"prompt": [3] * 48, "ttl_s": 3600}).raise_for_status()
        while time.monotonic() < deadline:
            n += 1
            prompt = [3] * 48 + [n % 7] * 16 if n % 2 else [n % 250, n // 250 % 250] + [5] * 94
            client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4,
                                                 "ignore_eos": True}).raise_for_status()
    return n


def evaluate(client: httpx.Client, queries: Sequence[PanelQuery]) -> list[dict]:
    """Every query through Prometheus' ``/api/v1/query`` (``client`` has its base URL), now: one row each."""
    rows = []
    for q in queries:
        body = client.get("/api/v1/query", params={"query": q.expr}).json()
        series = body.get("data", {}).get("result", []) if body.get("status") == "success" else []
        rows.append({"panel": q.panel, "ref_id": q.ref_id, "expr": q.expr, "status": body.get("status"),
                     "error": body.get("error"), "num_series": len(series),
                     "values": [float(s["value"][1]) for s in series], "labels": [s["metric"] for s in series]})
    return rows


def failed_queries(rows: Sequence[dict]) -> list[dict]:
    """The rows whose query Prometheus refused or that returned no series."""
    return [r for r in rows if r["status"] != "success" or not r["num_series"]]


def dashboard_table(rows: Sequence[dict]) -> str:
    """One row per query: panel, target, status, series and their first four values."""
    return markdown_table(["panel", "target", "status", "series", "values"],
                          [[r["panel"], r["ref_id"], r["status"], r["num_series"],
                            ", ".join("NaN" if math.isnan(v) else f"{v:.4g}" for v in r["values"][:4])] for r in rows],
                          align="lllrl")


def run_dashboard_check(check: DashboardCheck) -> dict:
    """Serve, send traffic while a Prometheus scrapes ``/metrics`` every second, then run every dashboard query.

    Keys: ``prometheus_version``, ``num_requests``, ``rate_interval``, ``queries`` (`evaluate`'s rows).
    """
    workdir = Path(tempfile.mkdtemp(prefix="jaxpaged-prometheus-"))
    with ServerProcess([f"--model={check.model}", f"--eviction_policy={check.eviction_policy}",
                        f"--compile_cache_dir={check.compile_cache_dir}", *SERVER_ARGS]) as server:
        target, address = f"{server.host}:{server.port}", f"127.0.0.1:{free_port()}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},  # JSON is YAML too
                  "scrape_configs": [{"job_name": "jaxpaged", "static_configs": [{"targets": [target]}]}]}
        (workdir / "prometheus.yml").write_text(json.dumps(config))
        url = f"http://{address}"
        with ChildProcess([check.prometheus, f"--config.file={workdir / 'prometheus.yml'}",
                           f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address={address}"],
                          f"{url}/-/ready", cwd=None, startup_timeout_s=30):
            num_requests = traffic(server.base_url, check.model, check.traffic_s)
            time.sleep(3.0)  # a last scrape or two after the traffic
            with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client:
                rows = evaluate(client, dashboard_queries(check.dashboard, rate_interval=check.rate_interval))
                version = client.get("/api/v1/status/buildinfo").json()["data"]["version"]
    print(f"{num_requests} requests; Prometheus {version}; dashboard {Path(check.dashboard).name}\n")
    return {"prometheus_version": version, "num_requests": num_requests, "rate_interval": check.rate_interval,
            "queries": rows}
