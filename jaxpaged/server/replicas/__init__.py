"""Data-parallel engine replicas on Ray Serve behind the prefix-aware router (needs the `serve` extra).

- `replica.EngineReplica`: one engine per Serve replica, in an engine core
  process the actor owns (or an `AsyncEngine` loop thread); streams its KV
  events and load to the ingress.
- `pool.ReplicaPool`: in the ingress, the `EngineClient` that
  `jaxpaged.server.api.build_app` serves: routes each request with a
  `jaxpaged.router.Router` fed by the replicas' events, and streams its outputs.
- `pinned_router.PinnedReplicaRouter`: a Ray Serve request router that sends a
  call to the replica the ingress chose.
- `app.build_replica_app` / `app.serve_replicas`: the Serve application.

Importing this package does not import Ray; its modules do.
"""
