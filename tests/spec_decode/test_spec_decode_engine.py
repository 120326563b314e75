"""Speculative decoding (n-gram) on a random checkpoint of every model family: greedy tokens equal speculation off.

The batch mixes what touches the KV rules: prompts sharing a prefix (prefix
hits), prompts longer than the step budget (chunked prefill), a pool too small
for the batch (preemption), an n=2 request (forked sequences sharing
blocks) and a beam request (its beams never speculate; they share blocks with
the n=2 request's prompt and fork with copy-on-write). Every step the
manager's invariants are checked; at the end nothing leaks, and every block
the prefix cache published (the KV event log, with its tokens) was published
with speculation off too: no rejected draft was ever hashed.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from jaxpaged.cache.events import BlockStored
from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.checkpoint import read_hf_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from tests.model.hf_families import FAMILIES, VOCAB

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                                or importlib.util.find_spec("transformers") is None,
                                reason="torch/transformers missing: pip install -e '.[hf]'")

MAX_TOKENS = 24
BLOCK = 8
BEAM = SamplingParams(temperature=0, beam_width=2, max_tokens=8, ignore_eos=True)


def prompts(seed: int) -> list[list[int]]:
    """Four prompts of repeated phrases (the n-gram proposer finds matches); two share a 24-token prefix."""
    rng = np.random.default_rng(seed)
    phrase = rng.integers(3, VOCAB, 6).tolist()
    shared = phrase * 4
    tails = [(rng.integers(3, VOCAB, 5).tolist() * 3) + phrase[:3] for _ in range(4)]
    long = shared + rng.integers(3, VOCAB, 30).tolist() + tails[0]  # longer than the step budget
    return [long, tails[1] + phrase, shared + tails[2], tails[3]]


def _num_blocks(path) -> int:
    """22 blocks' worth of KV bytes of every layer (with KV cache groups a block holds one group's layers), or
    14 when every layer has a sliding window (its blocks out of the window are freed): few enough to preempt."""
    config = read_hf_config(path)
    blocks = 14 if all(w is not None for w in config.layer_windows) else 22
    return blocks * config.num_layers // kv_cache_layout(config.layer_windows).num_tensors


def run(path, speculative: dict | None) -> tuple[Engine, dict[str, list[list[int]]], list[tuple]]:
    engine = Engine(EngineConfig(model=str(path), block_size=BLOCK, num_blocks=_num_blocks(path), max_num_seqs=4,
                                 max_num_batched_tokens=32, pool_fill_value=float("nan"),
                                 async_scheduling=False, speculative_config=speculative))
    log = engine.kv.enable_events(include_token_ids=True)
    batch = prompts(seed=5)
    for i, prompt in enumerate(batch):
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS + 3 * i, ignore_eos=True, n=2 if i == 1 else 1)
        engine.add_request(f"r{i}", prompt, params)
    engine.add_request("beam", batch[1], BEAM)
    finals, events = {}, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = [c.token_ids for c in out.outputs]
        engine.kv.check_invariants()
        events += log.take()
    assert engine.kv.stats.num_free_blocks == engine.num_blocks  # nothing leaks
    return engine, finals, events


def stored_prefixes(events: list) -> list[tuple[int, ...]]:
    """Each published block's whole prefix (its chain of parents' tokens, then its own)."""
    tokens_of: dict[bytes, tuple[int, ...]] = {}
    for event in events:
        if isinstance(event, BlockStored):
            prefix = tokens_of[event.parent_block_hash] if event.parent_block_hash is not None else ()
            for j, block_hash in enumerate(event.block_hashes):
                prefix = prefix + event.token_ids[j * BLOCK:(j + 1) * BLOCK]
                tokens_of[block_hash] = prefix
    return list(tokens_of.values())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            path = tmp_path_factory.mktemp(name) / "ckpt"
            FAMILIES[name].save(path, seed=11)
            made[name] = path
        return made[name]

    return get


@pytest.mark.parametrize("name", sorted(FAMILIES))  # one full-attention group (llama); sliding + full groups
def test_greedy_speculation_equals_speculation_off(checkpoints, name):
    path = checkpoints(name)
    plain, want, plain_events = run(path, None)
    spec, got, events = run(path, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                   "disable_by_batch_size": None})
    assert got == want and len(got["beam"]) == BEAM.beam_width
    stats = spec.stats
    assert spec.scheduler.num_preemptions > 0 and spec.kv.stats.prefix_hits_tokens > 0
    # both verification outcomes happened: drafts accepted, and drafts rejected (slots released)
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    assert stats.spec_accepted_per_position[0] >= stats.spec_accepted_per_position[-1]
    assert spec.stats.num_steps < plain.stats.num_steps  # accepted drafts saved steps
    # every block speculation published was published with speculation off too: no rejected draft was hashed
    # (a beam dropped on the way publishes its blocks in both runs, so the finals are no reference here)
    published = set(stored_prefixes(events))
    assert published and published <= set(stored_prefixes(plain_events))
