"""The `jaxpaged:http_requests` series counts the middleware's refusals too (401 from `Authenticate`, 413 from
`BodyLimit`), labelled by route path when the path is a route's and ``unmatched`` otherwise; the app runs
in-process (no engine: every request here is refused before a route would need one)."""

import asyncio
from unittest import mock

import httpx
from prometheus_client import CollectorRegistry

from jaxpaged.server.api import build_app
from jaxpaged.server.tenants import TenantKeys


def test_refusals_before_the_routes_are_counted():
    registry = CollectorRegistry()
    engine = mock.MagicMock(is_running=True, error=None)
    app = build_app(engine, served_model_name="tiny", registry=registry, max_request_body_bytes=100,
                    keys=TenantKeys.single("sk-right"))

    async def send_all():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as c:
            statuses = [(await c.post("/v1/completions", json={}, headers={"Authorization": "Bearer no"})).status_code,
                        (await c.get("/no/such/route")).status_code]
            big = await c.post("/v1/completions", content=b"x" * 101, headers={"Authorization": "Bearer sk-right"})
            return statuses + [big.status_code]

    assert asyncio.run(send_all()) == [401, 401, 413]

    def count(path, status):
        return registry.get_sample_value("jaxpaged:http_requests_total",
                                         {"method": "POST" if path != "unmatched" else "GET", "path": path,
                                          "status": status})

    assert count("/v1/completions", "401") == 1
    assert count("unmatched", "401") == 1
    assert count("/v1/completions", "413") == 1
