"""The jax.experimental.transfer transport: blocks offered to a puller that gave up are dropped after the offer
timeout, and a late pull fails within the puller's timeout instead of hanging or being served.

Server and puller share this process's one transfer server (the puller pulls from itself), which is how
the transport's own bookkeeping is reached without a second process.
"""

import time

import msgspec
import numpy as np
import pytest
import zmq

from jaxpaged.bench.online.server_process import free_port
from jaxpaged.kv_transfer import KVBlockBatch
from jaxpaged.kv_transfer.blocks import decode_header
from jaxpaged.kv_transfer.transport import (KVBlockClient, KVBlockServer, PullReply, PullRequest, TransferFailed,
                                            choose_transport)

SHAPE = (2, 2, 1, 4, 8)
KEYS = [bytes([k]) * 32 for k in range(3)]
BLOCKS = [np.full(SHAPE, k + 0.5, np.float32) for k in range(3)]
OFFER_S = 2.0  # generous: the in-time pull must land within it on a loaded machine


@pytest.fixture(scope="module")
def server():
    def lookup(keys):
        found = [(k, BLOCKS[KEYS.index(k)]) for k in keys if k in KEYS]
        return KVBlockBatch.from_blocks(b"id", [k for k, _ in found], [b for _, b in found], np.dtype(np.float32),
                                        SHAPE)
    listen = f"tcp://127.0.0.1:{free_port()}"
    assert choose_transport("auto", listen) == "jax"  # this machine's processes can start a transfer server
    block_server = KVBlockServer(listen, lookup, "jax", offer_timeout_s=OFFER_S)
    yield listen
    block_server.close()


def _offer(listen: str, keys: list[bytes]):
    """Ask for ``keys`` over the control channel only: the reply naming the offer, and its header."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(listen)
    try:
        socket.send(msgspec.msgpack.encode(PullRequest(1, keys)))
        assert socket.poll(10_000)
        reply_raw, header_raw, _ = socket.recv_multipart()
    finally:
        socket.close(0)
    return msgspec.msgpack.decode(reply_raw, type=PullReply), decode_header(header_raw)


def test_a_pull_gets_the_blocks_device_to_device(server):
    batch = KVBlockClient(timeout_s=10.0).pull(server, KEYS[1:])
    batch.check(b"id", np.dtype(np.float32), SHAPE)
    assert [k for k, _ in batch.blocks(np.dtype(np.float32))] == KEYS[1:]
    assert all((b == want).all() for (_, b), want in zip(batch.blocks(np.dtype(np.float32)), BLOCKS[1:]))


def test_an_offer_nobody_pulled_in_time_is_dropped_and_a_late_pull_fails_in_bounded_time(server):
    client = KVBlockClient(timeout_s=1.0)
    reply, header = _offer(server, KEYS[:2])
    assert reply.transfer_address is not None
    pulled = client.pull_offered(reply, header)  # in time: served
    assert np.array_equal(pulled.reshape(2, *SHAPE), np.stack(BLOCKS[:2]))
    reply, header = _offer(server, KEYS[:2])
    time.sleep(1.5 * OFFER_S)  # the puller gave up; the offer expires on the server
    start = time.monotonic()
    with pytest.raises(TransferFailed):
        client.pull_offered(reply, header)
    assert time.monotonic() - start < 10 * client.timeout_s  # failed by the puller's timeout, did not hang
