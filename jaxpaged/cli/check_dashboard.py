"""Run a real Prometheus against a live jaxpaged server and evaluate every Grafana panel query.

Starts ``jaxpaged serve`` (tiny model unless ``--model``), drives prefix-sharing and
cache-flooding traffic at it while a ``prometheus`` binary (Debian's ``prometheus``
package) scrapes ``/metrics`` every second, then runs every query of
``examples/grafana/jaxpaged-kv-cache.json`` through Prometheus' HTTP API
(``$__rate_interval`` as ``--rate_interval``) and prints one row per query: its
status, how many series it returned and their values
(`jaxpaged.bench.online.dashboard_check`).

    jaxpaged check-dashboard --md_out=out/check_dashboard.md

Exits non-zero if a query fails or returns no series.
"""

from __future__ import annotations

import shutil
import sys

from jaxpaged.bench.online.dashboard_check import DashboardCheck, dashboard_table, failed_queries, run_dashboard_check
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
# the server's model, eviction policy and compile cache
_SERVER = EngineFlags(FLAGS, ["model", "eviction_policy", "compile_cache_dir"], defaults={"model": "tiny"})
_MODEL, _POLICY = _SERVER.holders["model"], _SERVER.holders["eviction_policy"]
_COMPILE_CACHE = _SERVER.holders["compile_cache_dir"]
_PROMETHEUS = FLAGS.DEFINE_string("prometheus", "prometheus", "the Prometheus binary")
_DURATION = FLAGS.DEFINE_float("traffic_s", 40.0, "seconds of traffic while Prometheus scrapes")
_RATE_INTERVAL = FLAGS.DEFINE_string("rate_interval", "30s", "what Grafana's $__rate_interval becomes")
OUT = OutputFlags(FLAGS, json_out="out/check_dashboard.json", md_out="out/check_dashboard.md")

FLAGS.at_least(1.0, "traffic_s")


def main(argv):
    """Serve, send traffic while Prometheus scrapes, run every dashboard query; exit non-zero if one fails."""
    del argv
    if shutil.which(_PROMETHEUS.value) is None:
        sys.exit(f"no {_PROMETHEUS.value} binary: apt-get install prometheus")
    result = run_dashboard_check(DashboardCheck(model=_MODEL.value, prometheus=_PROMETHEUS.value,
                                                traffic_s=_DURATION.value, rate_interval=_RATE_INTERVAL.value,
                                                eviction_policy=_POLICY.value,
                                                compile_cache_dir=_COMPILE_CACHE.value))
    OUT.write(result, dashboard_table(result["queries"]))
    failed = failed_queries(result["queries"])
    if failed:
        sys.exit(f"{len(failed)} queries failed or returned nothing: {[(r['panel'], r['ref_id']) for r in failed]}")
