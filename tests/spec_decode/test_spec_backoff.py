"""A sequence whose drafts keep being rejected backs off: 1, 2, 4, ... (at most 8) plain steps between tries.

Checked against a plain-Python model of the rule, with a proposer whose drafts
are never the target's token; greedy tokens stay those of speculation off, and
one accepted draft resets the back-off.
"""

from __future__ import annotations

import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler.scheduler import MAX_SPEC_BACKOFF_STEPS

PROMPT = [5, 6, 7, 8] * 3
MAX_TOKENS = 40


class _Proposer:
    """Proposes the target's own next token (from `want`) for the first `num_right` calls, then `never`."""

    num_speculative_tokens = 4
    drafts_need_slots = False
    uses_hidden_states = False

    def __init__(self, want: list[int], never: int, num_right: int = 0):
        self.want, self.never, self.num_right = want, never, num_right

    def propose(self, token_ids, max_drafts):
        if self.num_right:
            self.num_right -= 1
            return [[self.want[len(t) - len(PROMPT)]] for t in token_ids]
        return [[self.never] * min(4, n) for n in max_drafts]


def _run(proposer: _Proposer | None) -> tuple[list[int], list[bool]]:
    """Greedy tokens, and per decode step whether it verified drafts (synchronous steps)."""
    engine = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=64, async_scheduling=False,
                                 speculative_config=None if proposer is None else {"method": "ngram"}))
    if proposer is not None:
        engine.scheduler.proposer = proposer
    engine.add_request("r", PROMPT, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    verified, tokens = [], None
    while engine.has_unfinished_requests():
        drafts_before = engine.stats.spec_num_drafts
        for out in engine.step():
            tokens = out.outputs[0].token_ids
        if engine.stats.num_steps > 1:  # after the prefill
            verified.append(engine.stats.spec_num_drafts > drafts_before)
    return tokens, verified


def _backoff_model(num_steps: int) -> list[bool]:
    """The rule in plain Python, every verify step a miss: which decode steps verify."""
    misses = skip = 0
    out = []
    for _ in range(num_steps):
        if skip:
            skip -= 1
            out.append(False)
            continue
        misses += 1
        skip = min(2 ** (misses - 1), MAX_SPEC_BACKOFF_STEPS)
        out.append(True)
    return out


@pytest.fixture(scope="module")
def reference() -> tuple[list[int], int]:
    """Speculation off's greedy tokens, and a token they never hold (a draft always rejected)."""
    want, _ = _run(None)
    return want, next(t for t in range(3, 250) if t not in want)


def test_rejected_drafts_back_off_as_the_model_says(reference):
    want, never = reference
    got, verified = _run(_Proposer(want, never))
    assert got == want
    assert verified == _backoff_model(len(verified))
    assert verified.count(True) < len(verified) // 3  # a miss costs more than a decode: mostly plain steps


def test_an_accepted_draft_resets_the_back_off(reference):
    want, never = reference
    got, verified = _run(_Proposer(want, never, num_right=2))  # two verify steps accept, then none does
    assert got == want
    assert verified[:2] == [True, True] and verified[2:] == _backoff_model(len(verified) - 2)
