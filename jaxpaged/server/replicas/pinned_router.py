"""A Ray Serve request router that sends a call to the replica the ingress chose.

The ingress decides where a request goes (its `jaxpaged.router.Router` holds
the KV-event index and the loads); this router only honours that choice: a
call made with ``target_replica=<replica unique id>`` goes to that replica,
or, when it is gone, to any live one. It also publishes the replica set Serve
reports (`live_replica_ids`), so the ingress drops a dead replica's blocks as
soon as Serve does.
"""

from __future__ import annotations

from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

# deployment name -> unique ids of its running replicas; written by Serve's router thread, read by the
# ingress's loop (replacing a dict entry is atomic under the GIL, so no lock)
_membership: dict[str, frozenset[str]] = {}


def live_replica_ids(deployment: str) -> frozenset[str] | None:
    """The running replicas of ``deployment`` as Serve last told this process's router (None: not yet)."""
    return _membership.get(deployment)


class PinnedReplicaRouter(RequestRouter):
    """Routes a call to the replica named by its ``target_replica`` keyword; unpinned calls to any replica."""

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        """The pinned replica alone when it is a candidate, else every candidate in one rank."""
        if pending_request is None:
            return [candidate_replicas]
        # Back off between attempts when the chosen replica does not answer (Serve's locality mixin sets
        # this; without it a replica slow to answer its queue-length probe makes this loop spin).
        pending_request.routing_context.should_backoff = True
        target = pending_request.kwargs.get("target_replica")
        if target is not None:
            for replica in candidate_replicas:
                if replica.replica_id.unique_id == target:
                    return [[replica]]
        return [candidate_replicas]

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        """Serve's new replica set: keep it, and publish its ids for the ingress."""
        super().update_replicas(replicas)
        ids = frozenset(r.replica_id.unique_id for r in replicas)
        _membership[self._deployment_id.name] = ids  # the base class keeps the deployment it routes for
