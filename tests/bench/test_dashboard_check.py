"""The dashboard check's verdict and table, against a hand-written dashboard and a stand-in Prometheus API."""

import json
import math

import httpx

from jaxpaged.bench.online.dashboard_check import dashboard_queries
from jaxpaged.bench.online.dashboard_check import dashboard_table, evaluate, failed_queries

DASHBOARD = {"panels": [
    {"title": "hit rate", "targets": [{"refId": "A", "expr": "rate(hits[$__rate_interval])"}]},
    {"title": "usage", "targets": [{"refId": "A", "expr": "usage"}, {"refId": "B", "expr": "missing_metric"}]},
    {"title": "broken", "targets": [{"refId": "A", "expr": "sum(("}]},
    {"title": "a row", "type": "row"},  # no targets
]}

# what Prometheus answers per query: series values, or an error for a query it cannot parse
ANSWERS = {"rate(hits[30s])": ["0.25", "NaN"], "usage": ["0.5"], "missing_metric": []}


def prometheus(request: httpx.Request) -> httpx.Response:
    """``/api/v1/query`` as Prometheus answers it."""
    assert request.url.path == "/api/v1/query"
    expr = request.url.params["query"]
    if expr not in ANSWERS:
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse error"})
    series = [{"metric": {"i": str(i)}, "value": [0, v]} for i, v in enumerate(ANSWERS[expr])]
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": series}})


def test_a_query_that_errors_or_returns_nothing_fails_and_the_table_shows_every_query(tmp_path):
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps(DASHBOARD))
    queries = dashboard_queries(path, rate_interval="30s")
    with httpx.Client(base_url="http://prometheus", transport=httpx.MockTransport(prometheus)) as client:
        rows = evaluate(client, queries)
    assert [(r["panel"], r["ref_id"], r["status"], r["num_series"]) for r in rows] == [
        ("hit rate", "A", "success", 2), ("usage", "A", "success", 1), ("usage", "B", "success", 0),
        ("broken", "A", "error", 0)]
    assert rows[0]["values"][0] == 0.25 and math.isnan(rows[0]["values"][1]) and rows[3]["error"] == "parse error"
    assert [(r["panel"], r["ref_id"]) for r in failed_queries(rows)] == [("usage", "B"), ("broken", "A")]
    assert dashboard_table(rows).splitlines() == [
        "| panel | target | status | series | values |", "|---|---|---|---:|---|",
        "| hit rate | A | success | 2 | 0.25, NaN |", "| usage | A | success | 1 | 0.5 |",
        "| usage | B | success | 0 |  |", "| broken | A | error | 0 |  |"]


def test_a_dashboard_whose_queries_all_answer_passes(tmp_path):
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps({"panels": DASHBOARD["panels"][:1]}))
    with httpx.Client(base_url="http://prometheus", transport=httpx.MockTransport(prometheus)) as client:
        assert failed_queries(evaluate(client, dashboard_queries(path, rate_interval="30s"))) == []
