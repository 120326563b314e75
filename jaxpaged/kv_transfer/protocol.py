"""What an engine asks of a KV connector, scheduler side and worker side.

The calls follow vLLM v1's ``KVConnectorBase_V1`` split, reduced to what a
host-driven engine needs:

=====================  ===========================================  =============================
here                   vLLM v1                                      when the engine calls it
=====================  ===========================================  =============================
``start_load``         get_num_new_matched_tokens +                 ``Engine.add_request``: which
                       update_state_after_alloc + start_load_kv     of the prompt's blocks to pull
``take_loaded``        get_finished (recving)                       start of every ``step()``
``request_finished``   request_finished + save_kv_layer /           after a step, for each
                       wait_for_save                                finished request
``cancel``             (request_finished of an aborted request)     ``Engine.abort``
=====================  ===========================================  =============================

The blocks a load brings land in the host tier, so the *allocation* of device
blocks for them stays the manager's one path (``plan_extension`` ->
``allocate_new``); vLLM's per-layer ``wait_for_layer_load`` has no counterpart
because the whole request waits outside the scheduler until its blocks are in.
"""

from __future__ import annotations

from typing import Protocol

from jaxpaged.sequence import Request


class KVConnector(Protocol):
    """Moves a request's KV blocks between this engine and others."""

    def start_load(self, request: Request) -> bool:
        """Begin pulling the prompt blocks of ``request`` this engine lacks; True if it must wait for them."""
        ...

    def take_loaded(self) -> list[str]:
        """Ids of requests whose load ended (blocks landed, or the load failed: they recompute)."""
        ...

    def cancel(self, request_id: str) -> None:
        """Forget a load in progress (the request was aborted); its blocks, if they come, are dropped."""
        ...

    def request_finished(self, requests: list[Request]) -> None:
        """Finished requests: keep the blocks other engines may pull (prefill side)."""
        ...

    def wait(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` for a load to end (the engine has nothing else to do)."""
        ...

    def close(self) -> None:
        """Stop serving and loading."""
        ...
