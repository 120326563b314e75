"""Random interleavings of add / step / fork / free / evict against a simulated device.

The simulated device is a numpy array standing in for the KV pool: each step
writes the real token ids into the slots the block tables point at, and applies
the copy-on-write pairs first. After every step the tokens read back through a
sequence's block table must be its own tokens, and every cached block must hold
the tokens its hash was made from: any sharing, eviction or reuse mistake shows
up as corrupted content, independently of the manager's own bookkeeping.
"""

import numpy as np
from cache_test_helpers import snapshot
from eviction_models import CheckedPolicy
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from jaxpaged.cache import KVCacheManager

NUM_BLOCKS = 10
BS = 4
REJECTED = 999  # a rejected draft token's K/V: never a token id, so reading it anywhere shows
BASE = [7, 3, 9, 1, 4, 4, 2, 8, 6, 5, 0, 1, 3, 3, 7, 2, 9, 9, 1, 0, 5, 6, 2, 4]
prompts = st.builds(
    lambda k, tail: BASE[:k] + tail,
    st.integers(0, len(BASE)),
    st.lists(st.integers(0, 3), max_size=8),
).filter(len)


class CacheMachine(RuleBasedStateMachine):
    """Drives one KVCacheManager; subclasses pick the hash and caching mode."""

    hash_algo = "sha256"
    enable_prefix_caching = True
    eviction_policy = "lru"

    def __init__(self):
        super().__init__()
        self.now = 0.0
        self.policy = CheckedPolicy(self.eviction_policy, NUM_BLOCKS)
        self.mgr = KVCacheManager(
            NUM_BLOCKS, BS, enable_prefix_caching=self.enable_prefix_caching, hash_algo=self.hash_algo,
            eviction_policy=self.policy, clock=lambda: self.now,
        )
        self.policy.pinned = lambda block_hash: block_hash in self.mgr._pool.pins
        self.mgr.on_evict = self._on_evict
        self.device = np.full((NUM_BLOCKS, BS), -1, dtype=np.int64)
        self.tokens: dict[int, list[int]] = {}
        self.freed: set[int] = set()
        self.next_id = 0
        self.fresh_token = 1000

    def _on_evict(self, block_id, block_hash, token_ids, parent_hash, cache_salt):
        held = {b for sid in self.tokens for b in self.mgr.block_table(sid)}
        assert block_id not in held, f"evicted block {block_id} is in a live block table"
        assert tuple(self.device[block_id]) == token_ids
        pins = self.mgr._pool.pins
        if block_hash in pins:  # a pinned block goes only when every other evictable one is pinned too
            unpinned = [b.block_id for b in self.mgr._pool.blocks
                        if b.ref_count == 0 and b.block_hash is not None and b.block_hash not in pins]
            assert not unpinned, f"pinned block {block_id} evicted while {unpinned} were not pinned"

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _run_step(self, sid: int, start: int, count: int) -> None:
        """The device writes tokens [start, start + count), then the host commits."""
        table = self.mgr.block_table(sid)
        tokens = self.tokens[sid]
        for pos in range(start, start + count):
            self.device[table[pos // BS], pos % BS] = tokens[pos]
        self.mgr.commit(sid, tokens, start + count)

    @rule(prompt=prompts, salt=st.sampled_from([None, "tenant"]), chunk=st.integers(1, 40))
    def add(self, prompt, salt, chunk):
        match = self.mgr.match_prefix(prompt, cache_salt=salt)
        for i, block_id in enumerate(match.blocks):  # every hit holds exactly our tokens
            assert list(self.device[block_id]) == prompt[i * BS : (i + 1) * BS]
        assert match.num_cached_tokens <= len(prompt) - 1
        num_new = min(chunk, len(prompt) - match.num_cached_tokens)
        before = snapshot(self.mgr)
        sid = self._new_id()
        if not self.mgr.allocate_new(sid, prompt, num_new, match, cache_salt=salt):
            assert snapshot(self.mgr) == before
            return
        self.tokens[sid] = list(prompt)
        self._run_step(sid, match.num_cached_tokens, num_new)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def step(self, data):
        """Next prefill chunk, or one decoded token once the prompt is done."""
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        tokens = self.tokens[sid]
        start = self.mgr.num_computed_tokens(sid)
        decoding = start == len(tokens)
        if decoding:
            if len(tokens) == NUM_BLOCKS * BS:
                return
            tokens.append(data.draw(st.integers(0, 3)))
            count = 1
        else:
            count = data.draw(st.integers(1, len(tokens) - start))
        before = snapshot(self.mgr)
        update = self.mgr.allocate_slots(sid, count, num_computed_tokens=start)
        if update is None:
            assert snapshot(self.mgr) == before
            if decoding:
                tokens.pop()
            return
        assert list(update.block_ids) == self.mgr.block_table(sid)[update.start:] if update.block_ids else \
            self.mgr.block_table(sid) == before[1][sid][0]  # what changed is what the update says
        for src, dst in update.copies:
            self.device[dst] = self.device[src]
        self._run_step(sid, start, count)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def speculative_step(self, data):
        """A decode with k draft tokens: slots for all, the device writes all, only m are accepted.

        The rejected drafts' slots hold a value no token has; the manager must
        commit (hash) only the accepted tokens and release the blocks past them.
        """
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        tokens = self.tokens[sid]
        start = self.mgr.num_computed_tokens(sid)
        k = data.draw(st.integers(1, 5))
        if start != len(tokens) or start + 1 + k > NUM_BLOCKS * BS:
            return
        before = snapshot(self.mgr)
        update = self.mgr.allocate_slots(sid, 1 + k, num_computed_tokens=start)
        if update is None:
            assert snapshot(self.mgr) == before
            return
        for src, dst in update.copies:
            self.device[dst] = self.device[src]
        accepted = data.draw(st.lists(st.integers(0, 3), max_size=k))
        written = [data.draw(st.integers(0, 3))] + accepted + [REJECTED] * (k - len(accepted))
        table = self.mgr.block_table(sid)
        for offset, token in enumerate(written):
            self.device[table[(start + offset) // BS], (start + offset) % BS] = token
        tokens.extend(written[:1 + len(accepted)])
        self.mgr.commit(sid, tokens, len(tokens))
        self.mgr.release_slots_after(sid, len(tokens))
        assert len(self.mgr.block_table(sid)) == -(-len(tokens) // BS)  # rejected slots' blocks are free

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = self._new_id()
        self.mgr.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.mgr.free(sid)
        del self.tokens[sid]
        self.freed.add(sid)

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def double_free_is_refused(self, data):
        sid = data.draw(st.sampled_from(sorted(self.freed)))
        before = snapshot(self.mgr)
        try:
            self.mgr.free(sid)
        except ValueError:
            pass
        else:
            raise AssertionError("double free was accepted")
        assert snapshot(self.mgr) == before

    @precondition(lambda self: self.mgr.num_free_blocks > 0)
    @rule()
    def fill_pool(self):
        """A request of never-seen tokens takes every free block, evicting all cached ones."""
        length = self.mgr.num_free_blocks * BS
        prompt = list(range(self.fresh_token, self.fresh_token + length))
        self.fresh_token += length
        sid = self._new_id()
        assert self.mgr.allocate_new(sid, prompt, length, self.mgr.match_prefix(prompt))
        assert self.mgr.num_free_blocks == 0 and self.mgr.stats.num_cached_blocks == len(
            {b for s in self.tokens for b in self.mgr.block_table(s)} & {b.block_id for b in self.mgr._pool.cached.values()}
        )
        self.tokens[sid] = prompt
        self._run_step(sid, 0, length)

    @rule(prompt=prompts, salt=st.sampled_from([None, "tenant"]), ttl=st.sampled_from([0.0, 1.0, 5.0]))
    def pin_prefix(self, prompt, salt, ttl):
        cached_before = len(self.mgr._pool.cached)
        num = self.mgr.pin_prefix(prompt, ttl, cache_salt=salt)
        assert 0 <= num <= min(len(prompt) // BS, cached_before)

    @rule(seconds=st.sampled_from([0.5, 2.0]))
    def clock_advances(self, seconds):
        self.now += seconds

    @rule()
    def reset_prefix_cache(self):
        if self.mgr.reset_prefix_cache():
            assert not self.tokens and self.mgr.stats.num_cached_blocks == 0

    @invariant()
    def bookkeeping_is_consistent(self):
        self.mgr.check_invariants()
        held = {b for sid in self.tokens for b in self.mgr.block_table(sid)}
        assert self.mgr.num_free_blocks == NUM_BLOCKS - len(held)
        assert self.mgr.stats.num_used_blocks == len(held)

    @invariant()
    def every_sequence_reads_back_its_own_tokens(self):
        for sid, tokens in self.tokens.items():
            table = self.mgr.block_table(sid)
            computed = self.mgr.num_computed_tokens(sid)
            read = [int(self.device[table[p // BS], p % BS]) for p in range(computed)]
            assert read == tokens[:computed], f"sequence {sid} reads corrupted K/V"

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        for block in self.mgr._pool.cached.values():
            assert tuple(self.device[block.block_id]) == block.token_ids

    def teardown(self):
        for sid in list(self.tokens):
            self.mgr.free(sid)
        stats = self.mgr.stats
        assert stats.num_used_blocks == 0 and stats.num_free_blocks == NUM_BLOCKS, "blocks leaked"
        assert self.mgr._in_flight.counts == {}
        self.mgr.check_invariants()


class XxhCacheMachine(CacheMachine):
    hash_algo = "xxh3_128"


class NoPrefixCachingMachine(CacheMachine):
    enable_prefix_caching = False


class LFUCacheMachine(CacheMachine):
    eviction_policy = "lfu"


class SieveCacheMachine(CacheMachine):
    eviction_policy = "sieve"


class SLRUCacheMachine(CacheMachine):
    eviction_policy = "slru"


def _test_case(machine, max_examples, steps=40):
    case = machine.TestCase
    case.settings = settings(max_examples=max_examples, stateful_step_count=steps, deadline=None)
    return case


TestCacheMachine = _test_case(CacheMachine, 60)
TestXxhCacheMachine = _test_case(XxhCacheMachine, 25)
TestNoPrefixCachingMachine = _test_case(NoPrefixCachingMachine, 15)
TestLFUCacheMachine = _test_case(LFUCacheMachine, 100, steps=60)
TestSieveCacheMachine = _test_case(SieveCacheMachine, 100, steps=60)
TestSLRUCacheMachine = _test_case(SLRUCacheMachine, 100, steps=60)
