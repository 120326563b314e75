"""Run a real Prometheus against a live jaxpaged server and evaluate every Grafana panel query.

    jaxpaged check-dashboard --md_out=out/check_dashboard.md

Starts ``jaxpaged serve`` and a ``prometheus`` binary (Debian's package) scraping it, sends traffic, then
runs every query of examples/grafana/jaxpaged-kv-cache.json; exits non-zero if one fails or returns no
series (docs/benchmarks/eviction.md, "The dashboard against a real Prometheus").
"""

from __future__ import annotations

import shutil
import sys

from jaxpaged.bench.online.dashboard_check import DashboardCheck, dashboard_table, failed_queries, run_dashboard_check
from jaxpaged.cli.options import CommandFlags

# the server's model, eviction policy and compile cache
COMMAND = CommandFlags(DashboardCheck, engine=["model", "eviction_policy", "compile_cache_dir"],
                       engine_defaults={"model": "tiny"}, json_out="out/check_dashboard.json",
                       md_out="out/check_dashboard.md")
FLAGS = COMMAND.flags


def main(argv):
    """Serve, send traffic while Prometheus scrapes, run every dashboard query; exit non-zero if one fails."""
    del argv
    check = COMMAND.options(**COMMAND.engine.kwargs())
    if shutil.which(check.prometheus) is None:
        sys.exit(f"no {check.prometheus} binary: apt-get install prometheus")
    result = run_dashboard_check(check)
    COMMAND.out.write(result, dashboard_table(result["queries"]))
    failed = failed_queries(result["queries"])
    if failed:
        sys.exit(f"{len(failed)} queries failed or returned nothing: {[(r['panel'], r['ref_id']) for r in failed]}")
