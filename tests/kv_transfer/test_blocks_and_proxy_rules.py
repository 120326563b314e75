"""The wire batch refuses every kind of mismatch; the proxy's prefill request and engine choice (no processes)."""

import json

import numpy as np
import pytest

from jaxpaged.kv_transfer import KVBlockBatch, KVOutbox, KVTransferRefused
from jaxpaged.kv_transfer.blocks import decode_header, encode_header
from jaxpaged.kv_transfer.connector import pull_order
from jaxpaged.server.disagg_proxy import decode_body, pick, prefill_body

SHAPE = (2, 2, 2, 4, 8)
IDENTITY = b"i" * 32


def _batch(n=3, dtype=np.float32):
    blocks = [np.full(SHAPE, k, dtype) for k in range(n)]
    return KVBlockBatch.from_blocks(IDENTITY, [bytes([k]) * 32 for k in range(n)], blocks, np.dtype(dtype), SHAPE)


def _received(batch):
    """The batch as the puller rebuilds it from the two frames."""
    return KVBlockBatch(decode_header(encode_header(batch.header)), bytes(memoryview(batch.payload).cast("B")))


def test_a_batch_that_matches_gives_back_its_blocks_in_key_order():
    batch = _received(_batch())
    batch.check(IDENTITY, np.dtype(np.float32), SHAPE)
    for k, (key, block) in enumerate(batch.blocks(np.dtype(np.float32))):
        assert key == bytes([k]) * 32 and block.shape == SHAPE and (block == k).all()


@pytest.mark.parametrize("identity, dtype, shape, damage, reason", [
    (b"x" * 32, np.float32, SHAPE, None, "different engine"),
    (None, np.float32, SHAPE, None, "identity is not fixed"),
    (IDENTITY, np.float16, SHAPE, None, "KV dtype differs"),
    (IDENTITY, np.float32, (2, 2, 2, 8, 8), None, "block shape differs"),
    (IDENTITY, np.float32, SHAPE, "truncate", "payload is"),
    (IDENTITY, np.float32, SHAPE, "flip", "digest differs"),
])
def test_every_mismatch_and_damage_is_refused(identity, dtype, shape, damage, reason):
    batch = _received(_batch())
    payload = bytearray(batch.payload)
    if damage == "truncate":
        payload = payload[:-1]
    elif damage == "flip":
        payload[5] ^= 1
    with pytest.raises(KVTransferRefused, match=reason):
        KVBlockBatch(batch.header, bytes(payload)).check(identity, np.dtype(dtype), shape)


def test_not_a_header_is_refused():
    with pytest.raises(KVTransferRefused, match="not a KV block header"):
        decode_header(b"\x00garbage")


def test_outbox_is_bounded_lru_and_skips_missing_keys():
    outbox = KVOutbox(2)
    for k in (b"a", b"b", b"c"):
        outbox.put(k, np.zeros(1))
    assert len(outbox) == 2 and b"a" not in outbox
    assert [k for k, _ in outbox.get_many([b"a", b"c", b"b"])] == [b"c", b"b"]


def test_prefill_request_is_one_unstreamed_token_and_engines_follow_the_prefix():
    body = {"prompt": "p", "max_tokens": 50, "stream": True, "stream_options": {"include_usage": True}, "n": 3,
            "max_completion_tokens": 50, "cache_salt": "s"}
    assert prefill_body(body) == {"prompt": "p", "max_tokens": 1, "stream": False, "n": 1,
                                  "max_completion_tokens": 1, "cache_salt": "s"}
    urls = [f"http://e{i}" for i in range(4)]
    shared = "x" * 300
    assert pick(urls, {"prompt": shared + "a"}) == pick(urls, {"prompt": shared + "b"})  # same first 256 chars
    assert len({pick(urls, {"prompt": f"{i}" + shared}) for i in range(40)}) > 1


def test_the_decode_hop_carries_the_prefill_engines_kv_address_and_pulls_from_it_alone():
    body = {"prompt": "p", "max_tokens": 9}
    answer = json.dumps({"choices": [], "kv_transfer_params": {"remote_address": "tcp://10.0.0.2:5601"}}).encode()
    assert decode_body(body, answer) == body | {"kv_transfer_params": {"remote_address": "tcp://10.0.0.2:5601"}}
    assert decode_body(body, None) == body and decode_body(body, b'{"choices": []}') == body
    assert decode_body(body, b"not json") == body
    peers = ("tcp://10.0.0.1:5600", "tcp://10.0.0.2:5601")
    assert pull_order(peers, "tcp://10.0.0.2:5601") == ("tcp://10.0.0.2:5601",)
    assert pull_order(peers, None) == peers
    assert pull_order(peers, "tcp://evil.example:22") == peers  # not a peer: never dialled
