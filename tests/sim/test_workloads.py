"""Workload generators: shapes, determinism, token range, multiturn history, arrivals."""

import pytest

from jaxpaged.sim.workloads import (
    TOKEN_ID_LIMIT, WORKLOADS, ConversationHistory, assign_arrivals, make_workload, max_context_len)


@pytest.mark.parametrize("name", WORKLOADS)
def test_deterministic_in_range_and_sized(name):
    a = make_workload(name, num_requests=6, seed=3)
    assert a == make_workload(name, num_requests=6, seed=3)
    assert a != make_workload(name, num_requests=6, seed=4)
    assert len(a) == 6 and len({r.request_id for r in a}) == 6
    assert all(0 <= t < TOKEN_ID_LIMIT for r in a for t in r.prompt_token_ids)
    assert all(r.arrival_time == 0.0 and r.max_tokens >= 1 for r in a)


def test_chatbot_shares_the_system_prompt():
    reqs = make_workload("chatbot", num_requests=4, system_len=32, user_len=10, output_len=5, jitter=0)
    assert all(r.prompt_token_ids[:32] == reqs[0].prompt_token_ids[:32] for r in reqs)
    assert all(len(r.prompt_token_ids) == 42 and r.max_tokens == 5 for r in reqs)
    assert len({tuple(r.prompt_token_ids[32:]) for r in reqs}) == 4


def test_multitenant_salts_match_system_prompts():
    reqs = make_workload("multitenant", num_requests=12, num_tenants=3, system_len=16, user_len=4)
    by_salt = {}
    for r in reqs:
        by_salt.setdefault(r.cache_salt, set()).add(tuple(r.prompt_token_ids[:16]))
    assert all(len(systems) == 1 for systems in by_salt.values())
    assert len(set().union(*by_salt.values())) == len(by_salt)


def test_multiturn_prompt_extends_previous_turn():
    reqs = make_workload("multiturn", num_requests=4, num_turns=2, user_len=5, output_len=3, jitter=0)
    first, second = [r for r in reqs if r.conversation_id == "c0"]
    history = ConversationHistory()
    assert not history.ready(second)
    with pytest.raises(ValueError):
        history.full_prompt(second)
    prompt0 = history.full_prompt(first)
    history.record(first, prompt0, [9, 9, 9])
    assert history.full_prompt(second) == prompt0 + [9, 9, 9] + second.prompt_token_ids
    assert max_context_len(reqs) == 5 + 3 + 5 + 3


def test_poisson_arrivals_and_bad_names():
    reqs = assign_arrivals(make_workload("unique", num_requests=50, prompt_len=4), rate=10.0, seed=1)
    times = [r.arrival_time for r in reqs]
    assert times == sorted(times) and times[0] > 0
    assert 2.0 < times[-1] < 10.0  # mean gap 0.1 s over 50 requests
    assert all(r.arrival_time == 0 for r in assign_arrivals(reqs, rate=0))
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("nope", num_requests=1)
    with pytest.raises(ValueError, match="chatbot"):
        make_workload("chatbot", num_requests=1, prompt_len=3)
