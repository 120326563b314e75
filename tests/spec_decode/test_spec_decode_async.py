"""Speculative decoding with the overlapped step (async scheduling): same greedy tokens, no compile per k.

A sequence drafts from known tokens only: a step in flight that verifies is
finished before the next is scheduled, and so is a plain decode in flight
whose sequence would draft (the proposer finds a proposal in the tokens
known); other plain decodes overlap. Greedy outputs must equal
speculation off on synchronous steps (the reference), with prefix hits,
preemption, n = 2, a stop token and a sampled request in the batch; the
manager's invariants hold every step and nothing leaks.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler.output import TOKEN_ON_DEVICE

LOOP = [5, 6, 7, 8] * 6  # prompt lookup always has a proposal
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None}


def _requests() -> list[tuple[str, list[int], SamplingParams]]:
    rng = np.random.default_rng(3)
    noise = rng.integers(9, 200, 12).tolist()
    greedy = dict(temperature=0, ignore_eos=True)
    return [
        ("loop", LOOP, SamplingParams(max_tokens=30, **greedy)),
        ("shared", LOOP + noise[:5], SamplingParams(max_tokens=22, **greedy)),  # prefix hit on LOOP's blocks
        ("plain", noise, SamplingParams(max_tokens=18, **greedy)),
        ("pair", noise[:6] * 3, SamplingParams(max_tokens=16, n=2, **greedy)),
        ("stops", LOOP[:10], SamplingParams(max_tokens=25, stop_token_ids=[7], **greedy)),
        ("sampled", LOOP, SamplingParams(temperature=0.8, seed=4, max_tokens=12, ignore_eos=True)),
    ]


def _run(speculative, async_scheduling: bool, num_blocks: int = 40):
    engine = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=num_blocks, pool_fill_value=float("nan"),
                                 async_scheduling=async_scheduling, speculative_config=speculative))
    scheduled = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: scheduled.append(schedule()) or scheduled[-1]
    for rid, prompt, params in _requests():
        engine.add_request(rid, prompt, params)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = [(c.token_ids, c.finish_reason) for c in out.outputs]
        engine.kv.check_invariants()
    assert engine.kv.stats.num_free_blocks == engine.num_blocks  # nothing leaks
    return engine, finals, scheduled


@pytest.fixture(scope="module")
def runs():
    return _run(None, async_scheduling=False), _run(SPEC, async_scheduling=True)


def test_overlapped_speculation_equals_synchronous_speculation_off(runs):
    (_, want, _), (spec, got, scheduled) = runs
    del want["sampled"], got["sampled"]  # same distribution, other tokens: tests/spec_decode/test_spec_decode_sampled
    assert got == want
    assert spec.scheduler.num_preemptions > 0 and spec.kv.stats.prefix_hits_tokens > 0
    stats = spec.stats
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens  # drafts accepted and rejected
    # every verify row's first input was known to the host (drafts never guess past a token in flight), and
    # plain decodes whose input was still on the device overlapped
    first_inputs = [t for out in scheduled for t in _verify_first_inputs(out)]
    assert first_inputs and TOKEN_ON_DEVICE not in first_inputs
    assert any(TOKEN_ON_DEVICE in out.token_ids for out in scheduled)


def _verify_first_inputs(out) -> list[int]:
    """The first input token of each verifying sequence in a scheduled step."""
    at, firsts = 0, []
    spans = dict(out.verify_spans)
    for i, n in enumerate(out.num_tokens):
        if i in spans:
            firsts.append(out.token_ids[at])
        at += n
    return firsts


class _CyclingProposer:
    """Proposes the target's own next tokens (so every draft is accepted), 1, 2, 3, 4, 1, ... of them in turn."""

    num_speculative_tokens = 4
    drafts_need_slots = False
    uses_hidden_states = False

    def __init__(self, want: list[int]):
        self.want, self._lengths = want, itertools.cycle(range(1, 5))

    def propose(self, token_ids, max_drafts):
        return [self.want[len(t) - len(LOOP):][:min(next(self._lengths), n)] for t, n in zip(token_ids, max_drafts)]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_verify_steps_do_not_compile_per_number_of_drafts(runs, async_scheduling):
    """k is bucketed: once a verify step has compiled, verify steps with other draft counts compile nothing."""
    (_, want, _), _ = runs
    engine = Engine(EngineConfig(model="tiny", block_size=16, num_blocks=32, async_scheduling=async_scheduling,
                                 speculative_config=SPEC))
    engine.scheduler.proposer = _CyclingProposer(want["loop"][0][0])
    engine.add_request("loop", LOOP, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    draft_counts, num_verify_steps, compiles_after_first = set(), 0, []
    while engine.has_unfinished_requests():
        before, drafts_before = engine.runner.num_compiles, engine.stats.spec_num_draft_tokens
        for out in engine.step():
            tokens = out.outputs[0].token_ids
        draft_counts.add(engine.stats.spec_num_draft_tokens - drafts_before)  # one verify step finished, or none
        if engine.stats.num_steps > 1 and engine.stats.last_step_tokens > 1:  # this call dispatched a verify step
            num_verify_steps += 1
            if num_verify_steps > 1:
                compiles_after_first.append(engine.runner.num_compiles - before)
    assert tokens == want["loop"][0][0]
    assert draft_counts - {0} == {1, 2, 3, 4} or (async_scheduling and {1, 2, 3} <= draft_counts)
    assert len(compiles_after_first) >= 3 and not any(compiles_after_first)
