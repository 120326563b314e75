"""Data-parallel engine replicas on Ray Serve behind the prefix-aware router (needs the `serve` extra).

- `replica.EngineReplica`: one engine (with its `AsyncEngine` loop) per Serve
  replica; streams its KV events and load to the ingress.
- `pool.ReplicaPool`: in the ingress, the `AsyncEngine` look-alike that
  `jaxpaged.server.api.build_app` serves: routes each request with a
  `jaxpaged.router.Router` fed by the replicas' events, and streams its outputs.
- `pinned_router.PinnedReplicaRouter`: a Ray Serve request router that sends a
  call to the replica the ingress chose.
- `app.build_replica_app` / `app.serve_replicas`: the Serve application.

Importing this package does not import Ray; its modules do.
"""
