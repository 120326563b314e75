"""The engine's public questions (load, cached hashes, KV events, reset) against plain-Python models of the rule.

A simulated runner keeps these free of compiles: only the controller's bookkeeping is asked.
"""

import pytest

from jaxpaged.cache import BlockStored
from jaxpaged.cache.hashing import chain_block_hashes
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.driver import make_sim_engine
from jaxpaged.sim.scenario import Deployment

BS, NUM_BLOCKS, MAX_SEQS = 4, 32, 2
TINY = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=NUM_BLOCKS * BS * 256, block_size=BS,
                  max_num_seqs=MAX_SEQS, max_num_batched_tokens=64, hash_algo="sha256")
ONE_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def _engine():
    engine, _ = make_sim_engine(TINY.engine_config(), TINY.model_config, TINY.cost_model())
    assert engine.num_blocks == NUM_BLOCKS
    return engine


def _prompt(i: int, num_blocks: int = 2) -> list[int]:
    return [100 * i + j + 1 for j in range(num_blocks * BS)]


def _drain(engine):
    while engine.has_unfinished_requests():
        engine.step()


def test_load_counts_waiting_running_and_held_blocks():
    engine = _engine()
    for i in range(3):
        engine.add_request(f"r{i}", _prompt(i), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    before = engine.load()
    assert (before.num_waiting, before.num_running, before.kv_usage) == (3, 0, 0.0)
    engine.step()  # two admitted (max_num_seqs), each holding its two full prompt blocks
    after = engine.load()
    assert (after.num_waiting, after.num_running) == (3 - MAX_SEQS, MAX_SEQS)
    assert after.kv_usage == pytest.approx(MAX_SEQS * 2 / NUM_BLOCKS)
    assert engine.kv_stats().usage == after.kv_usage
    _drain(engine)
    assert engine.load().num_running == 0 and engine.num_preemptions == 0


def test_cached_hashes_and_events_are_the_prompts_chained_block_hashes():
    engine = _engine()
    engine.enable_kv_events()
    prompts = [_prompt(0), _prompt(1, num_blocks=3)]
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, ONE_TOKEN)
    _drain(engine)
    expected = {h for p in prompts for h in chain_block_hashes(None, p, BS, (), "sha256")}
    assert engine.cached_block_hashes() == expected
    stored = [h for event in engine.take_kv_events() if isinstance(event, BlockStored) for h in event.block_hashes]
    assert sorted(stored) == sorted(expected)  # each block published once
    assert engine.take_kv_events() == []
    assert engine.prefix_caching_enabled and engine.eviction_policy == "lru"


def test_reset_prefix_cache_refuses_while_blocks_are_held_then_forgets_everything():
    engine = _engine()
    engine.add_request("held", _prompt(0), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()
    assert engine.reset_prefix_cache() is False
    assert engine.cached_block_hashes()  # nothing cleared
    _drain(engine)
    assert engine.reset_prefix_cache() is True
    assert engine.cached_block_hashes() == set()
    engine.add_request("again", _prompt(0), ONE_TOKEN)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert outputs[-1].num_cached_tokens == 0  # the earlier prompt is no hit any more
    assert engine.tier_stats() is None and engine.kv_residency_samples() is None


def test_kv_slot_usage_counts_computed_tokens_of_held_blocks():
    """Filled = computed tokens of the running sequences, reserved = every slot of their blocks."""
    engine = _engine()
    lengths = (2 * BS + 1, BS - 1)  # one block and a slot over two, and a part-filled single block
    for i, n in enumerate(lengths):
        engine.add_request(f"r{i}", _prompt(i, 3)[:n], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert engine.kv_slot_usage() == (0, 0)
    engine.step()  # both prompts computed, and the first output token sampled (not yet computed)
    blocks = [-(-n // BS) for n in lengths]
    assert engine.kv_slot_usage() == (sum(lengths), sum(blocks) * BS)
    _drain(engine)
    assert engine.kv_slot_usage() == (0, 0)


def test_step_phase_seconds_grow_with_steps_and_fit_inside_them():
    import time
    engine = _engine()
    assert engine.step_phase_seconds() == {"schedule": 0.0, "update": 0.0, "outputs": 0.0}
    engine.add_request("r0", _prompt(0), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    _drain(engine)
    wall = time.perf_counter() - start
    phases = engine.step_phase_seconds()
    assert all(seconds > 0 for seconds in phases.values()), phases
    assert sum(phases.values()) <= wall  # parts of the steps, never more than the steps took
    phases["schedule"] = -1.0  # a copy: the engine's totals are not the caller's
    assert engine.step_phase_seconds()["schedule"] > 0
