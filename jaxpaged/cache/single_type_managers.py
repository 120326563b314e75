"""The rules of one attention type over one KV cache group's block table (vLLM v1's ``SingleTypeKVCacheManager``).

Each KV cache group (``jaxpaged.cache.kv_groups``) gets one of these from
:func:`single_type_manager`; the coordinator (``kv_cache_coordinator``) asks
them, and only them, what differs between attention types:

- ``first_needed``: which leading blocks a sequence no longer needs once some
  tokens are computed (full attention: none; a window of W tokens: those wholly
  before ``num_computed - W + 1``);
- ``max_blocks``: the most blocks a sequence holds at once (what can ever fit);
- ``lookup`` and ``longest_hit``: which cached blocks can serve a prefix hit of
  a given length (full attention is prefix-closed; a window needs only the
  blocks its first computed token can see);
- ``key``: the prefix-cache key of a block hash in this group (group 0 keeps
  the plain hash, so a one-group model caches exactly the plain chained hashes).

They hold no per-sequence state: the manager keeps one table per group and
sequence. A new attention type (chunked-local layers, a state-space layer's
constant-size state) is one small subclass registered in
:data:`SINGLE_TYPE_MANAGERS` under its spec name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jaxpaged.cache.block_pool import KVBlock
from jaxpaged.cache.kv_groups import KVCacheGroup, group_key
from jaxpaged.mathutils import cdiv


class SingleTypeKVCacheManager:
    """One KV cache group's attention rules; subclasses say what their attention type keeps."""

    spec: str = ""  # the attention spec this class implements (a key of SINGLE_TYPE_MANAGERS)
    prefix_closed: bool = True  # a hit of L blocks implies every shorter hit (no fixpoint needed)
    drops_blocks: bool = False  # first_needed can be > 0: a sequence's old blocks are freed as it grows

    def __init__(self, group: int, window: int | None, block_size: int) -> None:
        self.group = group
        self.window = window
        self.block_size = block_size

    def key(self, block_hash: bytes) -> bytes:
        """The prefix-cache key of ``block_hash`` in this group."""
        return group_key(block_hash, self.group)

    def first_needed(self, num_computed: int) -> int:
        """Index of the first block still needed once ``num_computed`` tokens are computed."""
        raise NotImplementedError

    def max_blocks(self, num_tokens: int, chunk_tokens: int) -> int:
        """The most blocks a sequence of ``num_tokens`` holds at once, computing ``chunk_tokens`` per step."""
        raise NotImplementedError

    def lookup(self, get: Callable[[bytes], KVBlock | None], hashes: Sequence[bytes],
               max_len: int) -> list[KVBlock | None]:
        """This group's cached block (None: missing) for each of the first ``max_len`` hashes.

        A list shorter than ``max_len`` means the entries after it do not matter.
        """
        return [get(self.key(h)) for h in hashes[:max_len]]

    def longest_hit(self, served: Sequence[object | None], max_len: int) -> int:
        """The largest L <= ``max_len`` this group can serve, ``served[j]`` None where block j is missing."""
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every block of the context stays needed; a hit is the run of leading cached blocks."""

    spec = "full_attention"

    def first_needed(self, num_computed: int) -> int:
        """Always 0: full attention reads the whole context."""
        return 0

    def max_blocks(self, num_tokens: int, chunk_tokens: int) -> int:
        """Every block of the sequence."""
        return cdiv(num_tokens, self.block_size)

    def lookup(self, get: Callable[[bytes], KVBlock | None], hashes: Sequence[bytes],
               max_len: int) -> list[KVBlock | None]:
        """The cached blocks up to the first miss (nothing after it can be served)."""
        found: list[KVBlock | None] = []
        if self.group == 0:  # the plain hash is the key: the hot path of a one-group model
            for block_hash in hashes[:max_len]:
                block = get(block_hash)
                if block is None:
                    break
                found.append(block)
            return found
        for block_hash in hashes[:max_len]:
            block = get(self.key(block_hash))
            if block is None:
                break
            found.append(block)
        return found

    def longest_hit(self, served: Sequence[object | None], max_len: int) -> int:
        """The index of the first missing block (the run of leading served blocks)."""
        end = min(max_len, len(served))
        return next((j for j in range(end) if served[j] is None), end)


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A sliding window of ``window`` tokens: only the blocks the next query can see stay needed."""

    spec = "sliding_window"
    prefix_closed = False
    drops_blocks = True

    def first_needed(self, num_computed: int) -> int:
        """The first block holding one of the last ``window - 1`` tokens before position ``num_computed``."""
        return max(num_computed - self.window + 1, 0) // self.block_size

    def max_blocks(self, num_tokens: int, chunk_tokens: int) -> int:
        """The window's blocks plus a step's chunk, at most every block of the sequence."""
        total = cdiv(num_tokens, self.block_size)
        return min(total, cdiv(self.window - 1 + chunk_tokens, self.block_size) + 1)

    def longest_hit(self, served: Sequence[object | None], max_len: int) -> int:
        """Largest L whose blocks from ``first_needed(L * block_size)`` to L - 1 are all served."""
        bs = self.block_size
        missing_before = [0]  # missing_before[j]: missing blocks among the first j
        for entry in served[:max_len]:
            missing_before.append(missing_before[-1] + (entry is None))
        for length in range(len(missing_before) - 1, 0, -1):
            if missing_before[length] == missing_before[self.first_needed(length * bs)]:
                return length
        return 0


SINGLE_TYPE_MANAGERS: dict[str, type[SingleTypeKVCacheManager]] = {
    cls.spec: cls for cls in (FullAttentionManager, SlidingWindowManager)
}


def attention_spec(group: KVCacheGroup) -> str:
    """The attention spec of a KV cache group (its key in :data:`SINGLE_TYPE_MANAGERS`)."""
    return FullAttentionManager.spec if group.window is None else SlidingWindowManager.spec


def single_type_manager(group: KVCacheGroup, index: int, block_size: int) -> SingleTypeKVCacheManager:
    """The manager of group number ``index`` for its attention spec."""
    return SINGLE_TYPE_MANAGERS[attention_spec(group)](index, group.window, block_size)
