"""`KVCacheManager.release_slots_after`: speculative slots given back, never below the committed tokens."""

import pytest

from jaxpaged.cache import KVCacheManager


def test_release_slots_after_frees_only_uncommitted_blocks():
    mgr = KVCacheManager(8, 4)
    prompt = [1, 2, 3, 4, 5, 6]
    assert mgr.allocate_new("s", prompt, 6, mgr.match_prefix(prompt))
    mgr.commit("s", prompt, 6)
    assert mgr.allocate_slots("s", 1 + 5, num_computed_tokens=6) is not None  # a token and 5 drafts: 12 slots
    assert len(mgr.block_table("s")) == 3 and mgr.num_free_blocks == 5
    tokens = prompt + [7, 8]  # the token and one accepted draft
    mgr.commit("s", tokens, 8)
    assert mgr.release_slots_after("s", 8) == 1
    assert len(mgr.block_table("s")) == 2 and mgr.num_free_blocks == 6
    assert mgr.release_slots_after("s", 8) == 0
    mgr.check_invariants()
    with pytest.raises(ValueError, match="8 committed tokens"):
        mgr.release_slots_after("s", 7)
    mgr.free("s")
    assert mgr.num_free_blocks == 8
