"""KV connector: blocks move between engines by (block hash, KV cache group), checked on receive.

A prefill engine (``kv_role="prefill"``) keeps the full prompt blocks of each
finished request in an outbox and serves pulls for them over a transport; a
decode engine (``kv_role="decode"``) pulls the blocks of a new request's prompt
that it does not cache yet from its peers while it keeps stepping its running
sequences, lands them in its host tier and admits the request once they are
in, so the ordinary restore path (``plan_extension`` -> ``allocate_new``)
scatters them into its pool. See docs/disaggregation.md.
"""

from jaxpaged.kv_transfer.blocks import KVBlockBatch, KVTransferRefused
from jaxpaged.kv_transfer.connector import KV_ROLES, KV_TRANSPORTS, PeerKVConnector, TransferStats
from jaxpaged.kv_transfer.outbox import KVOutbox
from jaxpaged.kv_transfer.protocol import KVConnector

__all__ = ["KVBlockBatch", "KVConnector", "KVOutbox", "KVTransferRefused", "KV_ROLES", "KV_TRANSPORTS",
           "PeerKVConnector", "TransferStats"]
