"""Rule 1 / issue item 2: chained, canonical, process-independent block hashes."""

import hashlib
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from jaxpaged.cache import hash_block_tokens, hash_request_blocks
from jaxpaged.cache.hashing import chain_block_hashes, next_block_hasher, root_hash

ALGOS = ["sha256", "xxh3_128"]


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def test_encoding_is_the_documented_bytes():
    root = hashlib.sha256(b"jaxpaged.kv_pool-block-hash.v1").digest()
    tokens = [1, -2, 2**40, 7]
    token_bytes = struct.pack("<4q", *tokens)
    plain = hashlib.sha256(root + token_bytes + _u64(0)).digest()
    assert hash_block_tokens(None, tokens, ()) == plain

    blob = b"s" + _u64(2) + b"ab" + b"i" + _u64(2) + b"-7" + b"t" + _u64(10) + b"b" + _u64(1) + b"\x00"
    with_keys = hashlib.sha256(plain + token_bytes + blob + _u64(len(blob))).digest()
    assert hash_block_tokens(plain, tokens, ("ab", -7, (b"\x00",))) == with_keys


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("as_numpy", [False, True])
def test_request_hashes_fold_block_hashes(algo, as_numpy):
    tokens = list(range(100, 137))  # 4 full blocks of 8 and a partial one
    keys = (("cache_salt", "tenant"), "adapter-3")
    expected, parent = [], None
    for start in range(0, 32, 8):
        parent = hash_block_tokens(parent, tokens[start : start + 8], keys if start == 0 else (), hash_algo=algo)
        expected.append(parent)
    given = np.array(tokens, dtype=np.int32) if as_numpy else tokens
    assert hash_request_blocks(given, 8, "tenant", ("adapter-3",), algo) == expected
    # Resuming the chain midway gives the same tail.
    assert chain_block_hashes(expected[1], tokens[16:37], 8, (), algo) == expected[2:]


@pytest.mark.parametrize("algo", ALGOS)
def test_hash_commits_to_whole_prefix(algo):
    tokens = list(range(64))
    base = hash_request_blocks(tokens, 16, hash_algo=algo)
    early = hash_request_blocks([999] + tokens[1:], 16, hash_algo=algo)
    late = hash_request_blocks(tokens[:40] + [999] + tokens[41:], 16, hash_algo=algo)
    assert all(a != b for a, b in zip(base, early)), "a change in block 0 must change every later hash"
    assert late[:2] == base[:2] and all(a != b for a, b in zip(base[2:], late[2:]))
    assert len(base) == 4 and len(hash_request_blocks(tokens[:63], 16, hash_algo=algo)) == 3
    assert len(base[0]) == (32 if algo == "sha256" else 16)
    assert len(set(base)) == 4


@pytest.mark.parametrize("algo", ALGOS)
def test_salts_and_extra_keys_never_share_blocks(algo):
    tokens = list(range(48))
    variants = [
        hash_request_blocks(tokens, 16, None, (), algo),
        hash_request_blocks(tokens, 16, "a", (), algo),
        hash_request_blocks(tokens, 16, "b", (), algo),
        hash_request_blocks(tokens, 16, "", (), algo),
        hash_request_blocks(tokens, 16, None, ("a",), algo),
        hash_request_blocks(tokens, 16, "a", ("lora-1",), algo),
    ]
    all_hashes = [h for hashes in variants for h in hashes]
    assert len(set(all_hashes)) == len(all_hashes)


def test_algorithms_differ():
    tokens = list(range(32))
    assert hash_request_blocks(tokens, 16) != hash_request_blocks(tokens, 16, hash_algo="xxh3_128")
    assert root_hash("sha256") != root_hash("xxh3_128")


@pytest.mark.parametrize("algo", ALGOS)
def test_next_block_hasher_continues_the_chain(algo):
    tokens = list(range(300, 340))  # 5 blocks of 8
    chain = hash_request_blocks(tokens, 8, "tenant", hash_algo=algo)
    hash_next = next_block_hasher(8, algo)
    for index in range(1, 5):
        assert hash_next(chain[index - 1], tokens[index * 8 : (index + 1) * 8]) == chain[index]
    assert hash_next(chain[0], tuple(np.arange(8, 16))) == chain_block_hashes(chain[0], list(range(8, 16)), 8, (), algo)[0]
    with pytest.raises(ValueError, match="block of 8 token ids"):
        hash_next(chain[0], [1.5] * 8)
    with pytest.raises(ValueError, match="block of 8 token ids"):
        hash_next(chain[0], [1] * 7)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: hash_request_blocks([1], 4, hash_algo="md5"), "hash_algo must be one of"),
        (lambda: hash_request_blocks([1, 2], 0), "block_size must be positive"),
        (lambda: hash_block_tokens(b"short", [1], ()), "parent_hash must be None or 32 bytes"),
        (lambda: hash_block_tokens(None, [1], (1.5,)), "allowed types are str, bytes, int"),
        (lambda: hash_block_tokens(None, [2**63], ()), "int64 range"),
        (lambda: hash_request_blocks([1.0, 2.0], 2), "int64 range"),
        (lambda: hash_request_blocks(np.ones(4, np.float32), 2), "must be integers"),
    ],
)
def test_bad_input_is_a_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


_HASH_TABLE_SRC = """
import json
from jaxpaged.cache import hash_request_blocks

def hash_table():
    tokens = list(range(40))
    return {
        algo: [h.hex() for salt in (None, "s") for h in hash_request_blocks(tokens, 8, salt, ("x", 3), algo)]
        for algo in ("sha256", "xxh3_128")
    }
"""


def test_hashes_identical_across_processes_and_hash_seeds():
    child = _HASH_TABLE_SRC + "print(json.dumps(hash_table()))"
    outputs = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        run = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, check=True)
        outputs.append(json.loads(run.stdout))
    namespace: dict = {}
    exec(_HASH_TABLE_SRC, namespace)
    assert outputs[0] == outputs[1] == namespace["hash_table"]()
    assert len(outputs[0]["sha256"]) == 10
