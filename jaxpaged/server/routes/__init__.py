"""The HTTP routes `build_app` mounts, one module per job, each a `router(state)` over one `ServerState`.

- `completions`: ``/v1/completions``;
- `chat`: ``/v1/chat/completions``;
- `tokenize`: ``/tokenize``, ``/detokenize``;
- `cache`: ``/reset_prefix_cache``, ``/v1/cache/pin`` (and the requests' ``pin_ttl_s``);
- `health`: ``/health``, ``/v1/models``, ``/metrics``;
- `admin`: ``/debug/*`` (only with ``enable_debug_endpoints``).
"""
