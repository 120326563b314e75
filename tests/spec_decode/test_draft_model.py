"""The draft-model proposer: greedy tokens equal speculation off, and the draft's K/V follows the target's blocks.

The batch is the n-gram engine test's (prompts sharing a prefix, a prompt
longer than the step budget, a pool too small for the batch, an n=2 request
whose forks copy on write). A draft with the target's own weights must
accept every draft, and its pool must hold, at every computed position of
every running sequence, the K/V the target's pool holds there (same block
ids, computed in the same steps, rolled back alike). A smaller draft with
other weights is rejected most of the time: the output must not change.
Invariants are checked every step; nothing leaks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler.output import TOKEN_ON_DEVICE
from tests.spec_decode.test_spec_decode_engine import BLOCK, MAX_TOKENS, prompts, stored_prefixes

NUM_BLOCKS = 22


def _kv_at(pool: np.ndarray, table: list[int], num_tokens: int) -> np.ndarray:
    """K and V of positions [0, num_tokens) read through `table` from `[2, L, Hkv, N, B, D]`."""
    positions = np.arange(num_tokens)
    return pool[:, :, :, np.asarray(table)[positions // BLOCK], positions % BLOCK]


def _host_pool(pool) -> np.ndarray:
    return np.stack([np.stack([np.asarray(p) for p in pages]) for pages in (pool.k, pool.v)])


def _check_draft_kv_follows_target(engine: Engine) -> int:
    """Assert the draft pool equals the target pool at every running sequence's computed positions (same
    weights); returns how many positions were compared."""
    compared = 0
    target, draft = _host_pool(engine.runner.pool), _host_pool(engine.runner._draft.pool)
    for seq in engine.scheduler.running:
        n = seq.num_computed_tokens
        if n == 0:
            continue
        table = engine.kv.block_table(seq.seq_id)
        np.testing.assert_allclose(_kv_at(draft, table, n), _kv_at(target, table, n), rtol=1e-5, atol=1e-5)
        compared += n
    return compared


def run(speculative: dict | None, check_draft_kv: bool = False, async_scheduling: bool = False):
    engine = Engine(EngineConfig(model="tiny", block_size=BLOCK, num_blocks=NUM_BLOCKS, max_num_seqs=4,
                                 max_num_batched_tokens=32, pool_fill_value=float("nan"),
                                 async_scheduling=async_scheduling, speculative_config=speculative))
    log = engine.kv.enable_events(include_token_ids=True)
    engine.scheduled = []  # every step's SchedulerOutput, in order
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: engine.scheduled.append(schedule()) or engine.scheduled[-1]
    for i, prompt in enumerate(prompts(seed=5)):
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS + 3 * i, ignore_eos=True, n=2 if i == 1 else 1)
        engine.add_request(f"r{i}", prompt, params)
    finals, events, compared = {}, [], 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = [c.token_ids for c in out.outputs]
        engine.kv.check_invariants()
        events += log.take()
        if check_draft_kv:
            compared += _check_draft_kv_follows_target(engine)
    assert engine.kv.stats.num_free_blocks == engine.num_blocks  # nothing leaks
    if check_draft_kv:
        assert compared > 0
    return engine, finals, events


@pytest.fixture(scope="module")
def speculation_off():
    return run(None)[1]


def _draft(model: str, k: int = 3, disable_by_batch_size: int | None = None) -> dict:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k,
            "disable_by_batch_size": disable_by_batch_size}


@pytest.fixture(scope="module")
def synchronous_draft():
    # the draft loads "tiny" with the engine's seed: the target's own weights
    return run(_draft("tiny"), check_draft_kv=True)


def test_a_draft_with_the_targets_weights_accepts_every_draft(speculation_off, synchronous_draft):
    engine, got, events = synchronous_draft
    assert got == speculation_off
    stats = engine.stats
    assert stats.spec_num_draft_tokens > 0
    assert stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
    assert engine.scheduler.num_preemptions > 0 and engine.kv.stats.prefix_hits_tokens > 0
    finals = [tuple(p) + tuple(out) for i, p in enumerate(prompts(seed=5)) for out in got[f"r{i}"]]
    for prefix in stored_prefixes(events):
        assert any(f[:len(prefix)] == prefix for f in finals), "a published block holds a token never emitted"


def test_the_draft_model_with_overlapped_steps(speculation_off, synchronous_draft):
    """Overlapped steps: while 3 or more sequences run none drafts and the steps overlap (the draft catches up on
    decode tokens still on the device); below that the sequences draft after their last known token. The draft
    pool follows the target's at every step, every draft is accepted, and greedy tokens equal speculation off
    and the synchronous draft-model run."""
    engine, got, _ = run(_draft("tiny", disable_by_batch_size=3), check_draft_kv=True, async_scheduling=True)
    assert got == speculation_off == synchronous_draft[1]
    stats = engine.stats
    assert 0 < stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
    assert engine.scheduler.num_preemptions > 0 and engine.kv.stats.prefix_hits_tokens > 0
    # steps whose decode inputs were still on the device (overlapped), and verify steps
    assert any(TOKEN_ON_DEVICE in out.token_ids for out in engine.scheduled)
    assert any(out.verify_spans for out in engine.scheduled)


def test_a_smaller_draft_changes_no_greedy_token(speculation_off, tmp_path):
    config = load_config("tiny").to_dict() | {"name": "tiny-draft", "num_layers": 1, "hidden_size": 32,
                                              "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
    path = tmp_path / "tiny-draft.json"
    path.write_text(json.dumps(config))
    engine, got, _ = run(_draft(str(path), k=4))
    assert got == speculation_off
    stats = engine.stats
    # random weights disagree with the target: drafts were rejected (slots released, K/V rolled back)
    assert stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    assert engine.scheduler.num_preemptions > 0


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    path = tmp_path / "other-vocab.json"
    path.write_text(json.dumps(load_config("tiny").to_dict() | {"name": "other-vocab", "vocab_size": 300}))
    with pytest.raises(ValueError, match="vocabulary of 300 tokens, the target's has 272"):
        Engine(EngineConfig(model="tiny", block_size=BLOCK, num_blocks=NUM_BLOCKS, async_scheduling=False,
                            speculative_config=_draft(str(path))))
    with pytest.raises(ValueError, match="sliding-window layers"):
        Engine(EngineConfig(model="tiny", block_size=BLOCK, num_blocks=NUM_BLOCKS, async_scheduling=False,
                            speculative_config=_draft("tiny-gemma3")))
