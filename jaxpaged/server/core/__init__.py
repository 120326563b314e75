"""The engine core in its own process, and the API server's client for it.

`process.run_core` runs the engine (scheduler, KV manager, runner, tiers) and
sends, once per step, every request's new token ids; `client.CoreClient` is
the API server's `EngineClient` over it (tokenization, detokenization and
stop strings happen there); `launcher.serve_split` starts one core and N API
server processes on one port. `messages` is the wire format (msgspec
MessagePack over a ZeroMQ ROUTER/DEALER pair).
"""
