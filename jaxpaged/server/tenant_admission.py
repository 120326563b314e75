"""Per-tenant admission limits, checked by the engine's loop where every API server's requests meet.

A tenant's key may bound how many of its requests are in the engine at once
(``max_concurrent_requests``: waiting or running) and, separately, how many of
them wait for a batch slot (``max_queued_requests``). The API servers send the
limits with each request (`AdmissionLimits.to_wire`) and the engine's loop
(the core process with ``--engine_core=process``, whatever ``--api_server_count``)
counts the tenant's requests when it applies the add, so the bound holds across
API server processes; a request over it is refused with `TenantLimitError` (a
429 with ``Retry-After``) and changes nothing. Every prompt of a multi-prompt
request is one request here. With replicas, each replica counts its own.
Counting walks the tenant's own unfinished requests (the engine indexes them
by tenant), once per add of a tenant that has a limit (none for the others):
another tenant's queue costs nothing (docs/benchmarks/tenants.md).
"""

from __future__ import annotations

import dataclasses

from jaxpaged.server.request_stream import TenantLimitError


@dataclasses.dataclass(frozen=True)
class AdmissionLimits:
    """A tenant's bounds on its requests in the engine (None: unbounded)."""

    tenant: str
    max_concurrent_requests: int | None = None  # waiting or running
    max_queued_requests: int | None = None  # waiting only

    def to_wire(self) -> list | None:
        """Plain data for the engine command (None when nothing is bounded)."""
        if self.max_concurrent_requests is None and self.max_queued_requests is None:
            return None
        return [self.tenant, self.max_concurrent_requests, self.max_queued_requests]

    @classmethod
    def from_wire(cls, wire: list | None) -> AdmissionLimits | None:
        """`to_wire`'s inverse."""
        return None if wire is None else cls(*wire)


def check_admission(engine, limits: AdmissionLimits | None) -> None:
    """TenantLimitError when one more request of ``limits.tenant`` would pass one of its bounds."""
    if limits is None:
        return
    in_engine, waiting = engine.tenant_requests(limits.tenant)
    bound = limits.max_concurrent_requests
    if bound is not None and in_engine >= bound:
        raise TenantLimitError(f"tenant {limits.tenant!r} has {in_engine} requests in flight, its limit "
                               "(max_concurrent_requests); retry when one has finished")
    bound = limits.max_queued_requests
    if bound is not None and waiting >= bound:
        raise TenantLimitError(f"tenant {limits.tenant!r} has {waiting} requests waiting for a batch slot, its "
                               "limit (max_queued_requests); retry when one has started")
