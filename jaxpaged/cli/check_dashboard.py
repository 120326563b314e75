"""Run a real Prometheus against a live jaxpaged server and evaluate every Grafana panel query.

Starts ``jaxpaged serve`` (tiny model unless ``--model``), drives prefix-sharing and
cache-flooding traffic at it while a ``prometheus`` binary (Debian's ``prometheus``
package) scrapes ``/metrics`` every second, then runs every query of
``examples/grafana/jaxpaged-kv-cache.json`` through Prometheus' HTTP API
(``$__rate_interval`` as ``--rate_interval``) and prints one row per query: its
status, how many series it returned and their values.

    jaxpaged check-dashboard --md_out=out/check_dashboard.md

Exits non-zero if a query fails or returns no series.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from jaxpaged.bench.online.dashboard import DASHBOARD, dashboard_queries
from jaxpaged.bench.online.server_process import ServerProcess, free_port
from jaxpaged.bench.output import markdown_table
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
_MODEL = FLAGS.DEFINE_string("model", "tiny", "model the server runs")
_PROMETHEUS = FLAGS.DEFINE_string("prometheus", "prometheus", "the Prometheus binary")
_DURATION = FLAGS.DEFINE_float("traffic_s", 40.0, "seconds of traffic while Prometheus scrapes")
_RATE_INTERVAL = FLAGS.DEFINE_string("rate_interval", "30s", "what Grafana's $__rate_interval becomes")
_POLICY = FLAGS.DEFINE_string("eviction_policy", "lru", "the server's eviction policy")
OUT = OutputFlags(FLAGS, json_out="out/check_dashboard.json", md_out="out/check_dashboard.md")

FLAGS.at_least(1.0, "traffic_s")

SERVER_ARGS = ["--kv_budget_tokens=512", "--max_model_len=256", "--max_num_seqs=4",
               "--max_num_batched_tokens=256", "--kv_cache_metrics_sample=1"]
SCRAPE_CONFIG = """global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: jaxpaged
    static_configs:
      - targets: ["{target}"]
"""


def traffic(base_url: str, seconds: float) -> int:
    """Shared-prefix requests mixed with never-seen ones (so blocks are hit, evicted and pinned); returns count."""
    deadline, n = time.monotonic() + seconds, 0
    with httpx.Client(base_url=base_url, timeout=120.0, trust_env=False) as client:
        client.post("/v1/cache/pin", json={"prompt": [3] * 48, "ttl_s": 3600}).raise_for_status()
        while time.monotonic() < deadline:
            n += 1
            prompt = [3] * 48 + [n % 7] * 16 if n % 2 else [n % 250, n // 250 % 250] + [5] * 94
            client.post("/v1/completions", json={"model": _MODEL.value, "prompt": prompt, "max_tokens": 4,
                                                 "ignore_eos": True}).raise_for_status()
    return n


def start_prometheus(target: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    """A Prometheus scraping ``target`` every second; returns the process and its URL once ready."""
    config = workdir / "prometheus.yml"
    config.write_text(SCRAPE_CONFIG.format(target=target))
    port = free_port()
    log = open(workdir / "prometheus.log", "wb")
    proc = subprocess.Popen([_PROMETHEUS.value, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{(workdir / 'prometheus.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/-/ready", timeout=1.0, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("prometheus did not become ready")


def evaluate(url: str) -> list[dict]:
    """Every dashboard query through Prometheus' /api/v1/query, now."""
    rows = []
    for q in dashboard_queries(rate_interval=_RATE_INTERVAL.value):
        body = httpx.get(f"{url}/api/v1/query", params={"query": q.expr}, timeout=30.0, trust_env=False).json()
        series = body.get("data", {}).get("result", []) if body.get("status") == "success" else []
        values = [float(s["value"][1]) for s in series]
        rows.append({"panel": q.panel, "ref_id": q.ref_id, "expr": q.expr, "status": body.get("status"),
                     "error": body.get("error"), "num_series": len(series), "values": values,
                     "labels": [s["metric"] for s in series]})
    return rows


def markdown(rows: list[dict]) -> str:
    """One row per query: panel, target, status, series and their values."""
    return markdown_table(["panel", "target", "status", "series", "values"],
                          [[r["panel"], r["ref_id"], r["status"], r["num_series"],
                            ", ".join("NaN" if math.isnan(v) else f"{v:.4g}" for v in r["values"][:4])] for r in rows],
                          align="lllrl")


def main(argv):
    """Serve, send traffic while Prometheus scrapes, run every dashboard query; exit non-zero if one fails."""
    del argv
    if shutil.which(_PROMETHEUS.value) is None:
        sys.exit(f"no {_PROMETHEUS.value} binary: apt-get install prometheus")
    workdir = Path(tempfile.mkdtemp(prefix="jaxpaged-prometheus-"))
    with ServerProcess([f"--model={_MODEL.value}", f"--eviction_policy={_POLICY.value}", *SERVER_ARGS]) as server:
        prometheus, url = start_prometheus(f"{server.host}:{server.port}", workdir)
        try:
            num_requests = traffic(server.base_url, _DURATION.value)
            time.sleep(3.0)  # a last scrape or two after the traffic
            rows = evaluate(url)
            version = httpx.get(f"{url}/api/v1/status/buildinfo", timeout=5.0, trust_env=False).json()["data"]
        finally:
            prometheus.terminate()
            prometheus.wait(30)
    table = markdown(rows)
    print(f"{num_requests} requests; Prometheus {version['version']}; dashboard {DASHBOARD.name}\n")
    OUT.write({"prometheus_version": version["version"], "num_requests": num_requests,
               "rate_interval": _RATE_INTERVAL.value, "queries": rows}, table)
    failed = [r for r in rows if r["status"] != "success" or not r["num_series"]]
    if failed:
        sys.exit(f"{len(failed)} queries failed or returned nothing: {[(r['panel'], r['ref_id']) for r in failed]}")
