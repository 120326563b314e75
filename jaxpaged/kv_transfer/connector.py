"""`PeerKVConnector`: an engine's side of disaggregated prefill and decode.

Roles (``EngineConfig.kv_role``):

* ``prefill``: after each step, the full prompt blocks of every request that
  finished are read from the pool (one gather) into a :class:`KVOutbox`, which
  a :class:`KVBlockServer` thread serves to pullers.
* ``decode``: a new request's prompt is hashed as admission would hash it
  (block hashes chained from its ``cache_salt``, so namespaces stay apart
  across the hop); the keys neither the device prefix cache nor the host tier
  holds are pulled from the peers on a worker thread while the engine keeps
  stepping. The request waits outside the scheduler until the pull ends; the
  blocks that came, checked against this engine's identity, dtype and block
  shape, land in the host tier, and admission restores them like any host
  hit. A failed or refused pull lands nothing: the request computes its
  prompt itself.
* ``both``: each of the above.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time

import numpy as np

from jaxpaged.cache.hashing import chain_block_hashes, request_extra_keys
from jaxpaged.cache.kv_groups import group_key
from jaxpaged.kv_transfer.blocks import KVBlockBatch, KVTransferRefused
from jaxpaged.kv_transfer.outbox import KVOutbox
from jaxpaged.kv_transfer.transport import KVBlockClient, KVBlockServer, TransferFailed, choose_transport
from jaxpaged.mathutils import cdiv
from jaxpaged.offload.tiers import KVTiers, MissingBlocks
from jaxpaged.sequence import Request

log = logging.getLogger(__name__)

KV_ROLES = ("none", "prefill", "decode", "both")
KV_TRANSPORTS = ("auto", "zmq", "jax")


def pull_order(peers: tuple[str, ...], source: str | None) -> tuple[str, ...]:
    """Whom a decode engine asks for a request's blocks: the engine that prefilled it (the request's
    ``kv_source``) alone when that is one of ``peers``, else every peer (all at once: see ``_pull``). A
    source that is not a peer is never dialled (a client must not make the engine connect anywhere it names)."""
    return (source,) if source is not None and source in peers else peers


@dataclasses.dataclass
class TransferStats:
    """Cumulative counters of one engine's connector (blocks unless named otherwise)."""

    blocks_saved: int = 0  # prefill side: blocks put in the outbox
    loads: int = 0  # decode side: requests that waited for a pull
    blocks_wanted: int = 0  # keys asked of the peers
    blocks_already_held: int = 0  # prompt blocks the device cache or host tier had: not pulled
    blocks_received: int = 0  # blocks landed in the host tier
    bytes_received: int = 0
    pull_seconds: float = 0.0  # wall time of the pulls, summed
    refused: int = 0  # pulls whose blocks were refused (identity, dtype, shape, digest)
    failed: int = 0  # pulls that timed out or broke (the request recomputes)


@dataclasses.dataclass
class _Pulled:
    blocks: list[tuple[bytes, np.ndarray]]
    num_bytes: int
    seconds: float
    refused: int = 0
    failed: int = 0


class PeerKVConnector:
    """A ``KVConnector`` (``jaxpaged.kv_transfer.protocol``) over a block server and a pulling client."""

    def __init__(self, role: str, kv, runner, tiers: KVTiers | None, *, transport: str = "auto",
                 listen: str | None = None, peers: tuple[str, ...] = (), outbox_blocks: int = 1024,
                 timeout_s: float = 10.0, serve_delay_s: float = 0.0):
        """``kv``: the paged KV manager; ``runner``: owns the pool; ``tiers``: whose host tier loads land in."""
        if role not in KV_ROLES[1:]:
            raise ValueError(f"kv_role must be one of {KV_ROLES[1:]}, got {role!r}")
        if transport not in KV_TRANSPORTS:
            raise ValueError(f"kv_transport must be one of {KV_TRANSPORTS}, got {transport!r}")
        self.role, self.kv, self.runner, self.tiers = role, kv, runner, tiers
        self.block_size, self.num_groups, self.hash_algo = kv.block_size, kv.num_groups, kv.hash_algo
        self.dtype, self.block_shape = np.dtype(runner.kv_dtype), tuple(runner.kv_block_shape)
        self.identity: bytes | None = None  # set once the pool's fp8 scales are final (set_identity)
        self.stats = TransferStats()
        self.serve_delay_s = serve_delay_s
        self.outbox = self.server = self.client = None
        self.transport = None  # what this engine serves its blocks over (a puller follows each reply)
        if role in ("prefill", "both"):
            self.outbox = KVOutbox(outbox_blocks)
            self.transport = choose_transport(transport, listen)
            self.server = KVBlockServer(listen or "tcp://127.0.0.1:0", self._answer_pull, self.transport,
                                        offer_timeout_s=timeout_s)
        self.peers = tuple(peers)
        if role in ("decode", "both"):
            if tiers is None:
                raise ValueError("a decode engine needs the host tier its pulled blocks land in")
            self.client = KVBlockClient(timeout_s)
            self._executor = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="kv-pull")
            # one ask per peer per pull, on threads of their own (an ask waits on the network, not the CPU)
            self._ask_executor = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="kv-ask")
        self._loads: dict[str, tuple[concurrent.futures.Future, MissingBlocks]] = {}
        self._lock = threading.Lock()

    @property
    def address(self) -> str | None:
        """Where this engine serves its blocks (``tcp://host:port``), or None if it does not."""
        return None if self.server is None else self.server.address

    def set_peers(self, peers) -> None:
        """Pull from ``peers`` (ZeroMQ endpoints) from now on (pulls under way keep their list)."""
        self.peers = tuple(peers)

    def set_identity(self, identity: bytes) -> None:
        """This engine's identity digest (``jaxpaged.snapshot.identity_digest``): sent and required."""
        self.identity = identity

    def warm_up(self, max_model_len: int) -> None:
        """Compile the block moves this role makes for one request of up to ``max_model_len`` tokens, at every
        padded count (a prefill engine's outbox gather, a decode engine's scatter of pulled blocks), so no
        request's TTFT waits for one; with the persistent compile cache a later start only loads them."""
        max_blocks = cdiv(max_model_len, self.block_size) * self.num_groups
        start = time.perf_counter()
        if self.outbox is not None:
            self.runner.warm_read_blocks(max_blocks)
        if self.client is not None:
            self.runner.warm_write_blocks(max_blocks)
        log.info("KV transfer: block moves of 1..%d blocks compiled in %.1f s", max_blocks,
                 time.perf_counter() - start)

    # ---------------------------------------------------------------- decode side

    def start_load(self, request: Request) -> bool:
        """Pull the prompt blocks of ``request`` that nobody here holds; True if the request must wait."""
        if self.client is None or not self.peers or not self.kv.enable_prefix_caching:
            return False
        wanted = self.tiers.missing_prompt_blocks(request.prompt_token_ids, request.cache_salt)
        self.stats.blocks_already_held += wanted.num_held
        if not wanted.keys:
            return False
        self.stats.loads += 1
        self.stats.blocks_wanted += len(wanted.keys)
        future = self._executor.submit(self._pull, wanted.keys, pull_order(self.peers, request.params.kv_source))
        with self._lock:
            self._loads[request.request_id] = (future, wanted)
        return True

    def _pull(self, keys: list[bytes], peers: tuple[str, ...]) -> _Pulled:
        """Worker thread: ask every one of ``peers`` at once and take the first answer that holds every key;
        without one, the checked blocks of every answer that came (a chain's gaps are computed at admission).
        Each ask ends within the client's timeout, so the whole pull does too; a peer that never answers
        delays nothing once another has answered in full."""
        start = time.perf_counter()
        pulled = _Pulled([], 0, 0.0)
        asks = [self._ask_executor.submit(self._ask, peer, keys) for peer in peers]
        answers: list[list[tuple[bytes, np.ndarray]]] = []
        for ask in concurrent.futures.as_completed(asks):
            outcome, batch = ask.result()
            if outcome == "refused":
                pulled.refused += 1
            elif outcome == "failed":
                pulled.failed += 1
            else:
                pulled.num_bytes += batch.num_bytes
                blocks = batch.blocks(self.dtype)
                if len(blocks) == len(keys):  # a complete answer: the others are not waited for
                    answers = [blocks]
                    break
                answers.append(blocks)
        seen: set[bytes] = set()
        for blocks in answers:
            pulled.blocks.extend((key, block) for key, block in blocks if key not in seen)
            seen.update(key for key, _ in blocks)
        pulled.seconds = time.perf_counter() - start
        return pulled

    def _ask(self, peer: str, keys: list[bytes]) -> tuple[str, KVBlockBatch | None]:
        """One peer's answer, checked: ``("ok", batch)``, ``("refused", None)`` or ``("failed", None)``."""
        try:
            batch = self.client.pull(peer, keys)
            batch.check(self.identity, self.dtype, self.block_shape)
        except KVTransferRefused as err:
            log.warning("KV blocks from %s refused: %s", peer, err)
            return "refused", None
        except TransferFailed as err:
            log.warning("KV pull from %s failed: %s", peer, err)
            return "failed", None
        return "ok", batch

    def take_loaded(self) -> list[str]:
        """Requests whose pull ended: their blocks are now in the host tier (or they recompute)."""
        with self._lock:
            done = [rid for rid, (future, _) in self._loads.items() if future.done()]
            finished = [(rid, self._loads.pop(rid)) for rid in done]
        for _, (future, wanted) in finished:
            try:
                pulled = future.result()
            except Exception:  # a bug in the pull, not the peer: still never serve its blocks
                log.exception("KV pull crashed; the prompt is computed here")
                self.stats.failed += 1
                continue
            self.tiers.land(wanted, pulled.blocks)
            self.stats.blocks_received += len(pulled.blocks)
            self.stats.bytes_received += pulled.num_bytes
            self.stats.pull_seconds += pulled.seconds
            self.stats.refused += pulled.refused
            self.stats.failed += pulled.failed
        return [rid for rid, _ in finished]

    def is_loading(self, request_id: str) -> bool:
        """Whether ``request_id`` waits for its blocks."""
        with self._lock:
            return request_id in self._loads

    @property
    def num_loading(self) -> int:
        """Requests waiting for their blocks."""
        with self._lock:
            return len(self._loads)

    def cancel(self, request_id: str) -> None:
        """Forget a pending load (its blocks, if they come, are dropped)."""
        with self._lock:
            entry = self._loads.pop(request_id, None)
        if entry is not None:
            entry[0].cancel()

    def wait(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` for some pull to end."""
        with self._lock:
            futures = [future for future, _ in self._loads.values()]
        if futures:
            concurrent.futures.wait(futures, timeout_s, return_when=concurrent.futures.FIRST_COMPLETED)

    # ---------------------------------------------------------------- prefill side

    def request_finished(self, requests: list[Request]) -> None:
        """Copy the full prompt blocks of the finished requests into the outbox (one gather)."""
        if self.outbox is None or not requests:
            return
        keys, block_ids = [], []
        for request in requests:
            if request.aborted:
                continue
            tokens = request.prompt_token_ids
            num_blocks = len(tokens) // self.block_size
            hashes = chain_block_hashes(None, tokens[:num_blocks * self.block_size], self.block_size,
                                        request_extra_keys(request.cache_salt), self.hash_algo)
            for block_hash in hashes:
                for g in range(self.num_groups):
                    key = group_key(block_hash, g)
                    block_id = self.kv.cached_block_id(key)
                    if block_id is not None and key not in self.outbox and key not in keys:
                        keys.append(key)
                        block_ids.append(block_id)
        if not keys:
            return
        for key, block in zip(keys, self.runner.read_blocks(block_ids)):
            self.outbox.put(key, block)
        self.stats.blocks_saved += len(keys)

    def _answer_pull(self, keys: list[bytes]) -> KVBlockBatch:
        """Server thread: the outbox's blocks of ``keys``, under this engine's identity."""
        if self.serve_delay_s:
            time.sleep(self.serve_delay_s)  # tests: a window to kill this engine mid-transfer
        found = self.outbox.get_many(keys)
        return KVBlockBatch.from_blocks(self.identity or b"", [k for k, _ in found], [b for _, b in found],
                                        self.dtype, self.block_shape)

    def close(self) -> None:
        """Stop the server and the pulls."""
        if self.server is not None:
            self.server.close()
        if self.client is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._ask_executor.shutdown(wait=False, cancel_futures=True)
