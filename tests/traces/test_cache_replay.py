"""Issue 28 item 2: the cache-only trace replay's hit rates against a plain-Python count on a slice of the
Mooncake conversation trace, and the trace's parsing and token ids."""

import collections
import math

import numpy as np
import pytest

from jaxpaged.bench.offline.cache_replay import replay_trace
from jaxpaged.sim.traces import TRACE_BLOCK_SIZE, load_trace, parse_trace_line, prompt_token_ids

SLICE = 250


@pytest.fixture(scope="module")
def trace():
    requests = load_trace(limit=SLICE)
    return requests, [prompt_token_ids(r) for r in requests]


def _block_keys(request, block_size):
    """Identity of each full block of ``block_size`` tokens: the trace blocks its tokens end in, and its index."""
    keys = []
    for j in range(request.input_length // block_size):
        last = ((j + 1) * block_size - 1) // TRACE_BLOCK_SIZE
        keys.append((request.hash_ids[: last + 1], j))
    return keys


def model_lru_hits(requests, num_blocks, block_size):
    """Hit tokens of an LRU block cache of ``num_blocks`` blocks, requests one at a time in order: a prompt
    takes its longest cached run of full blocks (leaving one token to compute), fresh blocks come from empty
    ones first, then from the least recently freed cached ones; it frees its blocks deepest first."""
    lru = collections.OrderedDict()  # cached free blocks, least recently freed first
    empty = num_blocks
    hits = 0
    for r in requests:
        total = math.ceil(r.input_length / block_size)
        if total > num_blocks:
            continue
        keys = _block_keys(r, block_size)
        matched = 0
        for key in keys[: (r.input_length - 1) // block_size]:
            if key not in lru:
                break
            matched += 1
        hits += matched * block_size
        for key in keys[:matched]:
            del lru[key]
        fresh = total - matched
        from_empty = min(fresh, empty)
        empty -= from_empty
        for _ in range(fresh - from_empty):
            lru.popitem(last=False)
        owned = keys[:matched] + [key for key in keys[matched:] if key not in lru]  # duplicates stay private
        for key in reversed(owned):
            lru[key] = None
        empty += total - len(owned)  # the partial last block and private duplicates hold nothing cached
    return hits


def model_unbounded_hits(requests, block_size):
    """Hit tokens with a cache that never evicts: the longest run of full blocks seen before."""
    seen, hits = set(), 0
    for r in requests:
        keys = _block_keys(r, block_size)
        matched = 0
        for key in keys[: (r.input_length - 1) // block_size]:
            if key not in seen:
                break
            matched += 1
        hits += matched * block_size
        seen.update(keys)
    return hits


@pytest.mark.parametrize("block_size,capacity_tokens", [(512, 60 * 512), (512, 400 * 512), (128, 500 * 128)])
def test_lru_replay_matches_the_plain_python_count(trace, block_size, capacity_tokens):
    requests, prompts = trace
    result = replay_trace(requests, capacity_tokens=capacity_tokens, block_size=block_size, prompts=prompts)
    expected = model_lru_hits(requests, capacity_tokens // block_size, block_size)
    assert result.hit_tokens == expected and result.query_tokens == sum(r.input_length for r in requests)
    assert 0 < result.hit_rate < 1


@pytest.mark.parametrize("block_size", [512, 64])
def test_unbounded_replay_matches_the_prefixes_seen_before(trace, block_size):
    requests, prompts = trace
    result = replay_trace(requests, capacity_tokens=math.inf, block_size=block_size, prompts=prompts)
    assert result.hit_tokens == model_unbounded_hits(requests, block_size) and result.num_evictions == 0


def test_every_policy_lies_between_nothing_and_unbounded(trace):
    requests, prompts = trace
    unbounded = replay_trace(requests, capacity_tokens=math.inf, block_size=512, prompts=prompts).hit_tokens
    for policy in ("lru", "lfu", "sieve", "slru"):
        small = replay_trace(requests, capacity_tokens=60 * 512, block_size=512, policy=policy, prompts=prompts)
        assert 0 < small.hit_tokens < unbounded and small.num_evictions > 0, policy


def test_decode_blocks_take_room_from_prompts(trace):
    requests, prompts = trace
    without = replay_trace(requests, capacity_tokens=200 * 512, block_size=512, prompts=prompts)
    with_decode = replay_trace(requests, capacity_tokens=200 * 512, block_size=512, prompts=prompts, decode=True)
    assert with_decode.num_evictions > without.num_evictions and with_decode.hit_tokens <= without.hit_tokens


def test_prompts_share_exactly_the_prefixes_the_trace_shares(trace):
    requests, prompts = trace
    a, b = next((x, y) for x in range(len(requests)) for y in range(x)
                if requests[x].hash_ids[:2] == requests[y].hash_ids[:2] and requests[x].hash_ids[2:3] != requests[y].hash_ids[2:3]
                and min(requests[x].input_length, requests[y].input_length) > 3 * TRACE_BLOCK_SIZE)
    shared = 2 * TRACE_BLOCK_SIZE
    assert np.array_equal(prompts[a][:shared], prompts[b][:shared])
    assert not np.array_equal(prompts[a][shared:shared + TRACE_BLOCK_SIZE], prompts[b][shared:shared + TRACE_BLOCK_SIZE])
    assert all(len(p) == r.input_length and p.min() >= 0 and p.max() < 256 for p, r in zip(prompts, requests))


@pytest.mark.parametrize("line,field", [
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "hash_ids"),
    ('{"timestamp": -1, "input_length": 6, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "input_length"),
    ('{"timestamp": 0, "input_length": 6, "output_length": "2", "hash_ids": [1]}', "output_length"),
    ('[1, 2]', "JSON object"),
])
def test_malformed_trace_lines_name_the_field(line, field):
    with pytest.raises(ValueError, match=field):
        parse_trace_line(line)
