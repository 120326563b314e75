"""The KV cache manager with sliding-window groups against a plain-Python model of its rules.

Random interleavings of add / step / fork / free / fill over a simulated
device: each write stores ``(group, token)`` in the slot a group's table points
at, copy-on-write pairs are applied first. Independently of the manager's
bookkeeping, the model checks after every rule:

- each sequence reads its own tokens back through every group's table over
  the part that group must keep (full: everything; window W: from block
  ``(computed - W + 1) // BS`` on), and a sliding group has dropped exactly
  the blocks before that (as of its last growth);
- a prefix hit is exactly the longest one the model's own cache (what was
  published, minus what the evict callback reported) lets every group serve,
  and every hit block holds the prompt's tokens for its group;
- replaying the KV events gives exactly group 0's cache entries (the plain chained hashes);
- a lower tier (every evicted block's data, keyed by its group key) extends a
  prefix hit exactly as far as the model's union of device cache and tier lets
  every group serve; it restores only blocks a group holds (a sliding group's
  window), and the restored sequence then reads its own tokens back;
- nothing leaks once every sequence is freed.
"""

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from jaxpaged.cache.events import replay
from jaxpaged.cache import KVCacheManager
from jaxpaged.cache.kv_groups import NULL_BLOCK, kv_cache_layout

NUM_BLOCKS = 24
BS = 4
TAG = 16  # device slot value = token * TAG + group
BASE = [7, 3, 9, 1, 4, 4, 2, 8, 6, 5, 0, 1, 3, 3, 7, 2, 9, 9, 1, 0, 5, 6, 2, 4, 8, 8, 1, 3, 0, 2]
prompts = st.builds(lambda k, tail: BASE[:k] + tail, st.integers(0, len(BASE)),
                    st.lists(st.integers(0, 3), max_size=10)).filter(len)


def model_first_needed(window, computed):
    """The model's rule: the first block a query at position ``computed`` can see."""
    return 0 if window is None else max(computed - window + 1, 0) // BS


class HybridMachine(RuleBasedStateMachine):
    """One full and one sliding (W=6) layer: two groups."""

    layer_windows = (None, 6)

    def __init__(self):
        super().__init__()
        self.layout = kv_cache_layout(self.layer_windows)
        self.windows = self.layout.windows
        self.mgr = KVCacheManager(NUM_BLOCKS, BS, self.layout)
        self.mgr.on_evict = self._on_evict
        self.mgr.enable_events()
        self.mirror: set[bytes] = set()  # what a router replaying the events believes is cached
        self.device = np.full((NUM_BLOCKS, BS), -1, np.int64)
        self.tokens: dict[int, list[int]] = {}
        self.salt: dict[int, str | None] = {}
        self.skip: dict[int, list[int]] = {}  # the model's dropped-block count per group
        self.cache: dict[tuple, int] = {}  # (group, salt, prefix tokens) -> block id
        self.next_id = 0
        self.fresh = 1000
        self.tier: dict[bytes, tuple[tuple, np.ndarray]] = {}  # group key -> (model entry, evicted data)

    def _on_evict(self, block_id, key, token_ids, parent_hash, cache_salt):
        entry = next(e for e, b in self.cache.items() if b == block_id)
        assert cache_salt == entry[1]  # the chain's salt, for the lower tiers' namespaces
        del self.cache[entry]
        self.tier[key] = (entry, self.device[block_id].copy())
        assert all(block_id not in t for sid in self.tokens for t in self.mgr.group_block_tables(sid))

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    def _run(self, sid, start, count):
        tables = self.mgr.group_block_tables(sid)
        tokens = self.tokens[sid]
        for g, table in enumerate(tables):
            for pos in range(start, start + count):
                assert table[pos // BS] != NULL_BLOCK, "a write lands in a dropped block"
                self.device[table[pos // BS], pos % BS] = tokens[pos] * TAG + g
        old_full = start // BS
        self.mgr.commit(sid, tokens, start + count)
        for j in range(old_full, (start + count) // BS):  # the model's publish rule
            for g, table in enumerate(tables):
                entry = (g, self.salt[sid], tuple(tokens[:(j + 1) * BS]))
                if table[j] != NULL_BLOCK and entry not in self.cache:
                    self.cache[entry] = table[j]

    def _model_hit(self, prompt, salt, with_tier=False):
        """Longest L (blocks) every group serves from the model's cache (and tier), at least one token left."""
        held = set(self.cache) | ({entry for entry, _ in self.tier.values()} if with_tier else set())
        for length in range(max(len(prompt) - 1, 0) // BS, 0, -1):
            if all((g, salt, tuple(prompt[:(j + 1) * BS])) in held
                   for g, w in enumerate(self.windows)
                   for j in range(model_first_needed(w, length * BS), length)):
                return length
        return 0

    @rule(prompt=prompts, salt=st.sampled_from([None, "t"]), chunk=st.integers(1, 40))
    def add(self, prompt, salt, chunk):
        match = self.mgr.match_prefix(prompt, cache_salt=salt)
        if not self.mgr.can_fit(len(prompt)):
            return
        assert match.num_cached_tokens == self._model_hit(prompt, salt) * BS
        for g, blocks in enumerate(match.group_blocks):
            for j, block in enumerate(blocks):
                if block is not None:
                    assert list(self.device[block.block_id]) == [t * TAG + g for t in prompt[j * BS:(j + 1) * BS]]
        num_new = min(chunk, len(prompt) - match.num_cached_tokens)
        sid = self._new_id()
        free_before = self.mgr.num_free_blocks
        if not self.mgr.allocate_new(sid, prompt, num_new, match, cache_salt=salt):
            assert self.mgr.num_free_blocks == free_before
            return
        self.tokens[sid], self.salt[sid] = list(prompt), salt
        self.skip[sid] = [model_first_needed(w, match.num_cached_tokens) for w in self.windows]
        self._run(sid, match.num_cached_tokens, num_new)

    @precondition(lambda self: self.tier)
    @rule(prompt=prompts, salt=st.sampled_from([None, "t"]), chunk=st.integers(1, 40))
    def add_restoring_from_tier(self, prompt, salt, chunk):
        """Admission whose hit continues into the lower tier (what ``KVTiers`` does with groups)."""
        if not self.mgr.can_fit(len(prompt)):
            return
        match = self.mgr.match_prefix(prompt, cache_salt=salt)
        device_hit = match.num_cached_tokens // BS
        extension = self.mgr.plan_extension(match, self.tier.__contains__, (len(prompt) - 1) // BS)
        expected = self._model_hit(prompt, salt, with_tier=True)
        if extension is None:
            assert expected == device_hit
            return
        length = extension.num_blocks
        assert length == expected > device_hit
        for j, g in extension.slots:  # only blocks the group holds, each one the tier has
            assert j >= model_first_needed(self.windows[g], length * BS)
        indices = self.mgr.apply_extension(match, extension)
        num_new = min(chunk, len(prompt) - length * BS)
        sid = self._new_id()
        free_before = self.mgr.num_free_blocks
        if not self.mgr.allocate_new(sid, prompt, (length - device_hit) * BS + num_new, match, cache_salt=salt):
            assert self.mgr.num_free_blocks == free_before
            return
        table = self.mgr.block_table(sid)
        hashes = match.block_hashes
        for (j, g), index in zip(extension.slots, indices):
            key = hashes[j] if g == 0 else hashes[j] + g.to_bytes(2, "little")
            entry, data = self.tier[key]
            assert entry == (g, salt, tuple(prompt[:(j + 1) * BS]))
            self.device[table[index]] = data
        assert self.mgr.num_computed_tokens(sid) == length * BS
        self.tokens[sid], self.salt[sid] = list(prompt), salt
        self.skip[sid] = [model_first_needed(w, length * BS) for w in self.windows]
        tables = self.mgr.group_block_tables(sid)
        for j in range(device_hit, length):  # the model's publish rule for restored blocks
            for g, group_table in enumerate(tables):
                entry = (g, salt, tuple(prompt[:(j + 1) * BS]))
                if group_table[j] != NULL_BLOCK and entry not in self.cache:
                    self.cache[entry] = group_table[j]
        self._run(sid, length * BS, num_new)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def step(self, data):
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        tokens = self.tokens[sid]
        start = self.mgr.num_computed_tokens(sid)
        decoding = start == len(tokens)
        if decoding:
            if len(tokens) >= 60 or not self.mgr.can_fit(len(tokens) + 1):
                return
            tokens.append(data.draw(st.integers(0, 3)))
            count = 1
        else:
            count = data.draw(st.integers(1, len(tokens) - start))
        update = self.mgr.allocate_slots(sid, count, num_computed_tokens=start)
        self.skip[sid] = [max(s, model_first_needed(w, start)) for s, w in zip(self.skip[sid], self.windows)]
        if update is None:
            if decoding:
                tokens.pop()
            return
        if update.block_ids:
            assert list(update.block_ids) == self.mgr.block_table(sid)[update.start:]
        for src, dst in update.copies:
            self.device[dst] = self.device[src]
        self._run(sid, start, count)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = self._new_id()
        self.mgr.fork(parent, child)
        self.tokens[child], self.salt[child] = list(self.tokens[parent]), self.salt[parent]
        self.skip[child] = list(self.skip[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.mgr.free(sid)
        del self.tokens[sid], self.skip[sid]

    @precondition(lambda self: self.mgr.num_free_blocks >= self.layout.num_groups)
    @rule()
    def fill_pool(self):
        """Never-seen tokens take every free block (evicting every cached one nobody holds)."""
        length = self.mgr.num_free_blocks // self.layout.num_groups * BS
        prompt = list(range(self.fresh, self.fresh + length))
        self.fresh += length
        sid = self._new_id()
        assert self.mgr.allocate_new(sid, prompt, length, self.mgr.match_prefix(prompt))
        self.tokens[sid], self.salt[sid] = prompt, None
        self.skip[sid] = [0] * self.layout.num_groups
        self._run(sid, 0, length)

    @invariant()
    def bookkeeping_is_consistent(self):
        self.mgr.check_invariants()
        held = {b for sid in self.tokens for t in self.mgr.group_block_tables(sid) for b in t if b != NULL_BLOCK}
        assert self.mgr.num_free_blocks == NUM_BLOCKS - len(held)
        assert self.mgr.num_free_blocks == NUM_BLOCKS - self.mgr.stats.num_used_blocks

    @invariant()
    def each_group_keeps_what_its_window_needs(self):
        for sid, tokens in self.tokens.items():
            computed = self.mgr.num_computed_tokens(sid)
            for g, (table, w) in enumerate(zip(self.mgr.group_block_tables(sid), self.windows)):
                dropped = [j for j, b in enumerate(table) if b == NULL_BLOCK]
                assert dropped == list(range(self.skip[sid][g])), f"seq {sid} group {g} dropped {dropped}"
                for p in range(model_first_needed(w, computed) * BS, computed):
                    assert self.device[table[p // BS], p % BS] == tokens[p] * TAG + g, f"seq {sid} reads bad K/V"

    @invariant()
    def events_mirror_group_zero(self):
        """Replayed events give exactly the group-0 (plain-hash) entries: what every prefix needs."""
        replay(self.mgr.take_events(), self.mirror)
        assert self.mirror == {b.block_hash for (g, _, _), b_id in self.cache.items() if g == 0
                               for b in [self.mgr._pool.blocks[b_id]]}

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        for (g, _, prefix), block_id in self.cache.items():
            assert list(self.device[block_id]) == [t * TAG + g for t in prefix[-BS:]]
        assert len(self.cache) == self.mgr.stats.num_cached_blocks

    def teardown(self):
        for sid in list(self.tokens):
            self.mgr.free(sid)
        assert self.mgr.stats.num_used_blocks == 0 and self.mgr.num_free_blocks == NUM_BLOCKS, "blocks leaked"
        assert self.mgr._in_flight.counts == {}
        self.mgr.check_invariants()


class AllSlidingMachine(HybridMachine):
    """Mistral's case: every layer slides (one group, window 5)."""

    layer_windows = (5, 5)


class TwoSlidingGroupsMachine(HybridMachine):
    """One full layer and two sliding ones: vLLM's grouping makes two sliding groups of one layer."""

    layer_windows = (7, None, 7)


def _case(machine, max_examples):
    case = machine.TestCase
    case.settings = settings(max_examples=max_examples, stateful_step_count=40, deadline=None)
    return case


TestHybridMachine = _case(HybridMachine, 50)
TestAllSlidingMachine = _case(AllSlidingMachine, 25)
TestTwoSlidingGroupsMachine = _case(TwoSlidingGroupsMachine, 15)
