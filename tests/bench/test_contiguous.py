"""The contiguous-KV baseline: whole-region reservation, no sharing, admission limited, no leaks."""

import pytest

from jaxpaged.cache.contiguous import ContiguousKVCacheManager


def make(num_blocks=10, block_size=4, max_model_len=12):
    return ContiguousKVCacheManager(num_blocks, block_size, max_model_len=max_model_len)


def test_reserves_a_whole_region_of_consecutive_blocks():
    mgr = make()  # regions of 3 blocks; 10 blocks hold 3 regions, 1 block unusable
    assert (mgr.region_blocks, mgr.num_regions) == (3, 3)
    assert mgr.allocate_new("a", [1, 2], 2, mgr.match_prefix([1, 2]))
    assert mgr.stats.num_used_blocks == 3 and mgr.num_free_blocks == 7
    assert mgr.block_table("a") == [0]  # only the blocks holding allocated tokens are listed
    assert mgr.reserved_blocks("a") == [0, 1, 2]
    mgr.commit("a", [1, 2], 2)
    assert mgr.allocate_slots("a", 5, num_computed_tokens=2).copies == ()
    assert mgr.block_table("a") == [0, 1]
    mgr.check_invariants()


def test_no_sharing_and_no_prefix_hits():
    mgr = make()
    prompt = list(range(9))
    for seq in ("a", "b"):
        match = mgr.match_prefix(prompt)
        assert match.num_cached_tokens == 0 and match.blocks == []
        assert mgr.allocate_new(seq, prompt, 9, match)
        mgr.commit(seq, prompt, 9)
    assert not set(mgr.reserved_blocks("a")) & set(mgr.reserved_blocks("b"))
    assert mgr.num_cached_tokens("b") == 0
    assert mgr.stats.prefix_hits_tokens == 0 and mgr.stats.num_cached_blocks == 0
    with pytest.raises(ValueError, match="fork"):
        mgr.fork("a", "c")


def test_admission_is_limited_by_reservations_not_tokens():
    mgr = make()
    for seq in ("a", "b", "c"):  # one token each, yet each takes a full region
        assert mgr.allocate_new(seq, [7], 1)
    assert not mgr.allocate_new("d", [7], 1)  # 3 of 10 blocks hold tokens, but no region is free
    assert "d" not in mgr and mgr.stats.num_sequences == 3
    mgr.free("b")
    assert mgr.allocate_new("d", [7], 1)
    assert mgr.reserved_blocks("d") == [3, 4, 5]  # b's region, reused
    mgr.check_invariants()


def test_growth_past_the_region_and_bad_commits_raise():
    mgr = make()
    mgr.allocate_new("a", list(range(10)), 10)
    mgr.commit("a", list(range(10)), 10)
    with pytest.raises(ValueError, match="region"):
        mgr.allocate_slots("a", 3, num_computed_tokens=10)  # 13 > max_model_len 12
    with pytest.raises(ValueError, match="num_computed_tokens"):
        mgr.commit("a", list(range(12)), 11)  # slots 10, 11 never allocated
    with pytest.raises(ValueError, match="region"):
        mgr.allocate_new("b", list(range(13)), 1)
    with pytest.raises(ValueError, match="already allocated"):
        mgr.allocate_new("a", [1], 1)
    with pytest.raises(ValueError):
        ContiguousKVCacheManager(2, 4, max_model_len=12)  # one region needs 3 blocks


def test_nothing_leaks_after_free():
    mgr = make()
    for i in range(3):
        mgr.allocate_new(i, [1, 2, 3], 3)
    for i in range(3):
        mgr.free(i)
    assert mgr.stats.num_used_blocks == 0 and mgr.stats.usage == 0.0
    assert mgr.num_free_blocks == 10
    with pytest.raises(ValueError, match="not held"):
        mgr.free(0)
    mgr.check_invariants()


def test_engine_runs_the_baseline_with_limited_concurrency(tiny_model):
    from jaxpaged.engine import Engine, EngineConfig
    from jaxpaged.sampling_params import SamplingParams

    config = EngineConfig(model="tiny", block_size=4, num_blocks=20, max_model_len=32, kv_layout="contiguous")
    engine = Engine(config, tiny_model)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"r{i}", list(range(10 + i)), params)
    peak = 0
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
        peak = max(peak, len(engine.scheduler.running))
        engine.kv.check_invariants()
    assert peak == 2  # 20 blocks / 8-block regions
    assert sorted(len(o.outputs[0].token_ids) for o in outputs if o.finished) == [3, 3, 3, 3]
    assert engine.kv.stats.num_used_blocks == 0
