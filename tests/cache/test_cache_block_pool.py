"""Issue item 1 and rule 5: the O(1) free queue, its order, and eviction."""

import pytest

from jaxpaged.cache import BlockPool, FreeBlockQueue, KVBlock


def _ids(queue):
    return [block.block_id for block in queue]


def test_free_queue_links_and_unlinks_without_searching():
    blocks = [KVBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert _ids(queue) == [0, 1, 2, 3, 4] and len(queue) == 5
    queue.remove(blocks[2])  # from the middle
    assert _ids(queue) == [0, 1, 3, 4] and blocks[2].prev_free is None and blocks[2].next_free is None
    assert blocks[1].next_free is blocks[3] and blocks[3].prev_free is blocks[1]
    queue.append(blocks[2])
    queue.appendleft(*queue.popleft_many(1))
    assert queue.popleft_many(1) == [blocks[0]]
    queue.remove(blocks[4])
    queue.remove(blocks[1])
    assert _ids(queue) == [3, 2] and len(queue) == 2
    queue.remove(blocks[3])
    queue.remove(blocks[2])
    with pytest.raises(IndexError):
        queue.popleft_many(1)


def test_popleft_many_takes_the_head_in_order():
    blocks = [KVBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    taken = queue.popleft_many(3)
    assert taken == blocks[:3] and _ids(queue) == [3, 4] and len(queue) == 2
    assert all(b.prev_free is None and b.next_free is None for b in taken)
    assert queue.popleft_many(0) == [] and _ids(queue) == [3, 4]
    queue.appendleft(blocks[0])
    assert queue.popleft_many(3) == [blocks[0], blocks[3], blocks[4]] and len(queue) == 0
    with pytest.raises(IndexError):
        queue.popleft_many(1)
    queue.append(blocks[1])  # the sentinels are relinked: the queue still works
    assert _ids(queue) == [1] and queue.popleft_many(1) == [blocks[1]]


def test_free_queue_never_iterates_on_hot_paths(monkeypatch):
    """Allocate, touch and release must not walk the queue (that would be O(n))."""
    pool = BlockPool(6)
    monkeypatch.setattr(FreeBlockQueue, "__iter__", lambda self: pytest.fail("queue was walked"))
    a, b, c = pool.allocate(3)
    pool.cache_block(b, b"h" * 32, None, (1,), ())
    pool.release([c, b, a])
    pool.take([b])  # revive from the middle of the queue
    pool.allocate(5)
    assert pool.num_free == 0


def test_uncached_blocks_are_reused_before_cached_ones_are_evicted():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    for depth, block in enumerate(blocks[:2]):
        pool.cache_block(block, bytes([depth]) * 32, None, (depth,), ())
    pool.release(blocks[::-1])  # a sequence frees deepest first
    assert [b.block_id for b in pool.free_queue] == [2, 3, 1, 0]
    assert pool.allocate(2) == [blocks[2], blocks[3]] and pool.num_evictions == 0
    assert len(pool.cached) == 2


def test_eviction_is_lru_then_deepest_first_and_reports_each_block():
    pool = BlockPool(4)
    evicted = []
    pool.on_evict = lambda block_id, block_hash, tokens, parent, salt: evicted.append((block_id, block_hash, tokens, parent))
    old = pool.allocate(2)
    new = pool.allocate(2)
    for seq, tag in ((old, b"o"), (new, b"n")):
        for depth, block in enumerate(seq):
            parent = tag * 31 + bytes([depth - 1]) if depth else None
            pool.cache_block(block, tag * 31 + bytes([depth]), parent, (depth,), ())
    pool.release(old[::-1])  # freed first: least recently used
    pool.release(new[::-1])
    order = [block.block_id for block in pool.allocate(4)]
    assert order == [old[1].block_id, old[0].block_id, new[1].block_id, new[0].block_id]
    assert [e[0] for e in evicted] == order and evicted[0][1] == b"o" * 31 + b"\x01" and evicted[0][2] == (1,)
    assert evicted[0][3] == b"o" * 31 + b"\x00" and evicted[1][3] is None  # the parent hash, None for a root
    assert pool.cached == {} and pool.num_evictions == 4


def test_duplicate_hash_keeps_the_first_block():
    pool = BlockPool(2)
    first, second = pool.allocate(2)
    assert pool.cache_block(first, b"x" * 32, None, (1,), ())
    assert not pool.cache_block(second, b"x" * 32, None, (1,), ())
    assert pool.cached[b"x" * 32] is first and second.block_hash is None


def test_reset_cache_refused_while_blocks_are_used():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.cache_block(block, b"x" * 32, None, (1,), ())
    assert not pool.reset_cache() and len(pool.cached) == 1
    pool.release([block])
    assert pool.reset_cache() and pool.cached == {} and block.block_hash is None


def test_in_flight_windows_count_each_computing_sequence():
    from jaxpaged.cache.in_flight import InFlightHashes

    in_flight = InFlightHashes()
    hashes = [b"a", b"b", b"c"]
    in_flight.move_window(hashes, (0, 0), (0, 2))  # seq 1 computes a, b
    in_flight.move_window(hashes, (0, 0), (1, 3))  # seq 2 computes b, c
    assert in_flight.counts == {b"a": 1, b"b": 2, b"c": 1}
    in_flight.move_window(hashes, (0, 2), (2, 2))  # seq 1 committed both
    assert in_flight.counts == {b"b": 1, b"c": 1} and b"a" not in in_flight
    in_flight.move_window(hashes, (1, 3), (3, 3))  # seq 2 freed
    assert in_flight.counts == {}
