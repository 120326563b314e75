"""What the ingress and the replicas exchange (plain picklable records)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxpaged.cache.events import KVEvent
from jaxpaged.router import ReplicaLoad
from jaxpaged.server.request_stream import EngineDeadError, QueueFullError, TenantLimitError
from jaxpaged.server.engine_client import ModelInfo  # noqa: F401 - the replicas send it to the ingress


@dataclass(frozen=True)
class ReplicaReport:
    """One batch of a replica's KV events (oldest first) and its load when they were taken.

    ``first`` marks the first report of a replica's life (its events then start
    with ``AllBlocksCleared``); ``resync`` one whose events rebuild the whole
    cache (sent when the ingress did not know the replica).
    """

    replica_id: str
    actor_name: str
    events: list[KVEvent]
    load: ReplicaLoad
    first: bool = False
    resync: bool = False


@dataclass(frozen=True)
class Accepted:
    """A replica's first answer to ``generate``: the engine took the request."""


@dataclass(frozen=True)
class RemoteError:
    """A replica refused a request; the ingress raises it again as the same kind of error."""

    kind: str  # "ValueError", "TypeError", "QueueFullError", "TenantLimitError" or "EngineDeadError"
    message: str

    KINDS = {"ValueError": ValueError, "TypeError": TypeError, "QueueFullError": QueueFullError,
             "TenantLimitError": TenantLimitError, "EngineDeadError": EngineDeadError}

    @classmethod
    def of(cls, err: BaseException) -> "RemoteError":
        """The record of ``err`` (one of ``KINDS``)."""
        return cls(type(err).__name__, str(err))

    def exception(self) -> BaseException:
        """The error to raise in the ingress."""
        return self.KINDS[self.kind](self.message)


@dataclass
class ReplicaCacheView:
    """A replica's own account of its prefix cache and load (the introspection endpoint)."""

    replica_id: str
    actor_name: str
    cached_hashes: set[bytes]
    load: ReplicaLoad
    extra: dict = field(default_factory=dict)
