"""Transports: how a pull request reaches a prefill engine and its blocks come back.

Both transports share one control channel, ZeroMQ (a ROUTER socket in the
serving engine's process, a DEALER per pulling thread): the puller sends the
keys it wants, the server answers with a :class:`KVBlockHeader` for the ones
its outbox holds. What differs is how the payload travels:

* ``zmq``: the payload is the reply's last frame (host memory, copied once
  into the socket). Works wherever the two processes can reach each other.
* ``jax``: the server stages the blocks as one device array and offers it with
  ``jax.experimental.transfer`` (``TransferServer.await_pull``) until
  ``offer_timeout_s`` has passed (an offer whose puller gave up is dropped
  then, not kept for ever); the puller pulls it device to device with
  ``TransferConnection.pull``, through one transfer server per process (two in
  one process abort), so the bytes never cross the control socket, and waits
  for the data no longer than its own timeout (a pull of an offer that is gone
  never completes: it is abandoned, never served). On CPU both ends are host
  memory; the code is the same on GPUs.
* ``auto`` (:func:`choose_transport`): ``jax`` where this process can start
  its transfer server, else ``zmq``. Only the serving side chooses: a puller
  follows each reply.

A ZeroMQ multipart reply arrives whole or not at all, and the jax pull is
checked against the header's digest, so a server killed mid-transfer leaves
the puller with a timeout or an error, never a partial batch.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import threading
import time
from typing import Callable

import msgspec
import numpy as np
import zmq

from jaxpaged.kv_transfer.blocks import KVBlockBatch, KVTransferRefused, decode_header, encode_header

log = logging.getLogger(__name__)


class TransferFailed(RuntimeError):
    """The peer did not answer in time, or its transport failed: nothing was received."""


class PullRequest(msgspec.Struct, array_like=True):
    """Puller -> server: the keys wanted (``request_no`` matches the answer to the question)."""

    request_no: int
    keys: list[bytes]


class PullReply(msgspec.Struct, array_like=True):
    """Server -> puller, before the header and payload frames: how the payload travels.

    ``transfer_address`` / ``uuid`` are set when it waits on the server's jax
    transfer server instead of following as a frame.
    """

    request_no: int
    transfer_address: str | None = None
    uuid: int = 0


class KVBlockServer:
    """Serves pulls from ``lookup(keys) -> KVBlockBatch`` on a background thread until :meth:`close`.

    ``listen`` is a ZeroMQ endpoint (``tcp://host:port``; port 0 picks a free
    one, read back from :attr:`address`). With ``transport="jax"`` payloads are
    offered through this process's jax transfer server.
    """

    def __init__(self, listen: str, lookup: Callable[[list[bytes]], KVBlockBatch], transport: str = "zmq",
                 offer_timeout_s: float = 10.0):
        self._lookup = lookup
        self._transport = transport
        self._offer_timeout = datetime.timedelta(seconds=offer_timeout_s)
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if listen.endswith(":0"):
            port = self._socket.bind_to_random_port(listen[:-2])
            self.address = f"{listen[:-2]}:{port}"
        else:
            self._socket.bind(listen)
            self.address = listen
        self._uuids = itertools.count(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kv-block-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            client, raw = self._socket.recv_multipart()
            try:
                request = msgspec.msgpack.decode(raw, type=PullRequest)
                self._socket.send_multipart([client, *self._answer(request)], copy=False)
            except Exception:  # a bad request must not end the server: log it, answer nothing
                log.exception("KV block server: could not answer a pull")
        self._socket.close(0)

    def _answer(self, request: PullRequest) -> list:
        batch = self._lookup(request.keys)
        header = encode_header(batch.header)
        if self._transport == "jax" and batch.header.keys:
            server = local_transfer_server(self.address)
            uuid = next(self._uuids)
            import jax
            server.await_pull(uuid, [jax.device_put(batch.payload)],
                              timeout=datetime.datetime.now() + self._offer_timeout)
            reply = PullReply(request.request_no, server.address(), uuid)
            return [msgspec.msgpack.encode(reply), header, b""]
        return [msgspec.msgpack.encode(PullReply(request.request_no)), header, batch.payload]

    def close(self) -> None:
        """Stop serving (the socket closes on the server thread)."""
        self._stop.set()
        self._thread.join(timeout=5)


class KVBlockClient:
    """Pulls blocks from peers; one DEALER socket per (thread, peer), dropped after a failure."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._context = zmq.Context.instance()
        self._local = threading.local()
        self._request_nos = itertools.count(1)

    def pull(self, peer: str, keys: list[bytes]) -> KVBlockBatch:
        """The blocks ``peer`` holds of ``keys`` (unchecked; see ``KVBlockBatch.check``).

        Raises :class:`TransferFailed` when no whole answer came within the timeout.
        """
        sockets = self._local.__dict__.setdefault("sockets", {})
        socket = sockets.get(peer)
        if socket is None:
            socket = sockets[peer] = self._context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(peer)
        request_no = next(self._request_nos)
        try:
            socket.send(msgspec.msgpack.encode(PullRequest(request_no, keys)))
            while True:
                if not socket.poll(int(self.timeout_s * 1000)):
                    raise TransferFailed(f"no answer from KV peer {peer} within {self.timeout_s} s")
                reply_raw, header_raw, payload = socket.recv_multipart(copy=False)
                reply = msgspec.msgpack.decode(reply_raw.bytes, type=PullReply)
                if reply.request_no == request_no:
                    break  # an older answer (to a pull that timed out) is skipped
            header = decode_header(header_raw.bytes)
            if reply.transfer_address is None:
                return KVBlockBatch(header, payload.buffer)
            return KVBlockBatch(header, self.pull_offered(reply, header))
        except (TransferFailed, KVTransferRefused, zmq.ZMQError, msgspec.DecodeError, ValueError) as err:
            socket.close(0)
            del sockets[peer]
            if isinstance(err, (TransferFailed, KVTransferRefused)):
                raise
            raise TransferFailed(f"KV pull from {peer} failed: {err}") from err

    def pull_offered(self, reply: PullReply, header) -> np.ndarray:
        """The payload through ``jax.experimental.transfer`` (device to device), as host bytes to check."""
        import jax
        import jax.numpy as jnp
        server = local_transfer_server(None)
        connections = self._local.__dict__.setdefault("connections", {})
        connection = connections.get(reply.transfer_address)
        if connection is None:
            connection = connections[reply.transfer_address] = server.connect(reply.transfer_address)
        device = jax.devices()[0]
        spec = jax.ShapeDtypeStruct((len(header.keys), *header.block_shape), jnp.dtype(header.dtype),
                                    sharding=jax.sharding.SingleDeviceSharding(device))
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=self.timeout_s)
        try:
            (array,) = connection.pull(reply.uuid, [spec], timeout=deadline)
            # A pull whose offer is gone (expired on the server) never completes, whatever the pull's own
            # timeout says: the wait for its data is bounded here. (No helper taking the array: a traceback
            # that printed it would wait for its data for ever.)
            give_up, pause = time.monotonic() + self.timeout_s, 1e-4
            while not array.is_ready():
                if time.monotonic() >= give_up:
                    raise TimeoutError(f"the pulled blocks did not arrive within {self.timeout_s} s")
                time.sleep(pause)
                pause = min(pause * 2, 5e-3)
            return np.ascontiguousarray(jax.device_get(array))
        except Exception as err:  # the peer died, the offer is gone or the pull timed out: drop the connection
            connections.pop(reply.transfer_address, None)
            raise TransferFailed(f"jax transfer pull from {reply.transfer_address} failed: {err}") from err


def choose_transport(transport: str, listen: str | None) -> str:
    """The transport a serving engine uses: ``auto`` is ``jax`` where this process can start its
    ``jax.experimental.transfer`` server, else ``zmq``; ``zmq`` and ``jax`` are taken as given."""
    if transport != "auto":
        return transport
    try:
        local_transfer_server(listen)
    except Exception as err:  # noqa: BLE001 - any failure to start it means the fallback
        log.info("jax.experimental.transfer is not available here (%s): KV blocks travel over ZeroMQ", err)
        return "zmq"
    return "jax"


_transfer_server = None
_transfer_lock = threading.Lock()


def local_transfer_server(listen: str | None):
    """This process's one ``jax.experimental.transfer`` server (two in one process abort), started once.

    It binds the host of ``listen`` (``tcp://host:port``) when given, else 127.0.0.1.
    """
    global _transfer_server
    with _transfer_lock:
        if _transfer_server is None:
            import jax
            from jax.experimental import transfer
            host = "127.0.0.1"
            if listen:
                host = listen.split("://", 1)[-1].rsplit(":", 1)[0] or host
            _transfer_server = transfer.start_transfer_server(jax.devices()[0].client, f"{host}:0", [f"{host}:0"])
        return _transfer_server
