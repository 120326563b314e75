"""Scheduling policies (jaxpaged/scheduler/policy.py) on the engine with the tiny model: the order requests get
their first token in, and who is preempted, against the rules written out by hand; greedy outputs do not
depend on the policy (each request's tokens equal its FCFS tokens)."""

import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def engine(policy: str, **overrides) -> Engine:
    config = dict(model="tiny", num_blocks=64, block_size=4, max_model_len=64, max_num_seqs=1,
                  max_num_batched_tokens=64, scheduling_policy=policy) | overrides
    return Engine(EngineConfig(**config))


def run(e: Engine) -> tuple[list[str], dict[str, list[int]]]:
    """Step until done; (request ids in the order their first token came, each request's tokens)."""
    first, tokens = [], {}
    while e.has_unfinished_requests():
        for out in e.step():
            if out.request_id not in first and out.outputs[0].token_ids:
                first.append(out.request_id)
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
    return first, tokens


def prompt(i: int) -> list[int]:
    return [10 + i, 20 + i, 30 + i, 40 + i, 50 + i]


def test_priority_runs_lower_values_first_ties_by_arrival_and_fcfs_by_arrival():
    priorities = {"a": 5, "b": 1, "c": 5, "d": 0, "e": 1}
    orders, outputs = {}, {}
    for policy in ("fcfs", "priority"):
        e = engine(policy)
        for i, (rid, p) in enumerate(priorities.items()):
            e.add_request(rid, prompt(i), GREEDY, priority=p)
        orders[policy], outputs[policy] = run(e)
    assert orders["fcfs"] == list(priorities)
    # all queued before the first step, one sequence at a time: by priority, ties by arrival
    assert orders["priority"] == ["d", "b", "e", "a", "c"]
    assert outputs["priority"] == outputs["fcfs"]


def test_priority_preempts_a_running_lower_priority_request_for_blocks():
    """5 blocks of 4 tokens: "low" (12 prompt tokens) holds 4 after four steps; "high" needs 2 to start."""
    long_prompt = list(range(100, 112))
    outcome = {}
    for policy in ("fcfs", "priority"):
        e = engine(policy, num_blocks=5, max_num_seqs=2)
        e.add_request("low", long_prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), priority=9)
        for _ in range(4):
            e.step()
        e.add_request("high", prompt(1), GREEDY, priority=0)
        e.step()
        running = sorted(s.request.request_id for s in e.scheduler.running)
        outcome[policy] = running, e.scheduler.num_preemptions, run(e)[1]
    assert outcome["fcfs"][:2] == (["low"], 0)  # high waits for blocks behind low
    assert outcome["priority"][:2] == (["high"], 1)  # low was preempted to make room for high
    assert outcome["priority"][2] == outcome["fcfs"][2]  # and recomputed to the same tokens


def test_fair_shares_admission_between_tenants_by_served_tokens():
    e = engine("fair")
    for i in range(6):
        e.add_request(f"heavy{i}", prompt(i), GREEDY, tenant="heavy")
    e.add_request("light0", prompt(6), GREEDY, tenant="light")
    e.add_request("light1", prompt(7), GREEDY, tenant="light")
    first, _ = run(e)
    # heavy0 ran first (admitted alone); then the light tenant, with the lower counter, goes next
    assert first[:4] == ["heavy0", "light0", "heavy1", "light1"]
    fcfs = engine("fcfs")
    for i in range(6):
        fcfs.add_request(f"heavy{i}", prompt(i), GREEDY, tenant="heavy")
    fcfs.add_request("light0", prompt(6), GREEDY, tenant="light")
    assert run(fcfs)[0][-1] == "light0"  # without the fair policy the light tenant waits behind all six


@pytest.mark.parametrize("bad", [True, 1.5, 2**40, "1"])
def test_a_bad_priority_is_refused_naming_it(bad):
    e = engine("priority")
    with pytest.raises(ValueError, match="priority"):
        e.add_request("x", prompt(0), GREEDY, priority=bad)
    assert not e.has_unfinished_requests()



def _random_requests():
    import random
    rng = random.Random(7)
    return [(f"r{i}", [rng.randrange(1, 200) for _ in range(rng.randrange(4, 16))],
             SamplingParams(temperature=0, max_tokens=rng.randrange(4, 12), ignore_eos=True),
             rng.randrange(-2, 3), rng.choice(["a", "b", "c", None]), rng.randrange(2)) for i in range(14)]


def _run_random(policy: str) -> tuple[dict, int]:
    """The random workload on a pool small enough to preempt; checks the cache manager every step and that
    nothing is held at the end. (tokens by request, preemptions)."""
    e = engine(policy, num_blocks=10, max_num_seqs=4, max_num_batched_tokens=16)
    tokens, pending = {}, _random_requests()
    while pending or e.has_unfinished_requests():
        for _ in range(pending[0][5] if pending else 0):  # 0 or 1 arrivals before each step
            rid, p, params, priority, tenant, _ = pending.pop(0)
            e.add_request(rid, p, params, priority=priority, tenant=tenant)
        if not e.has_unfinished_requests() and pending:
            rid, p, params, priority, tenant, _ = pending.pop(0)
            e.add_request(rid, p, params, priority=priority, tenant=tenant)
        for out in e.step():
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
        e.kv.check_invariants()
    assert e.kv_stats().usage == 0  # nothing held once every request finished
    return tokens, e.scheduler.num_preemptions


@pytest.fixture(scope="module")
def fcfs_random():
    return _run_random("fcfs")


@pytest.mark.parametrize("policy", ["priority", "fair"])
def test_random_overload_gives_fcfs_tokens_and_leaks_no_block(policy, fcfs_random):
    """A small pool, random priorities, tenants, lengths and arrivals: every request's greedy tokens equal its
    tokens under fcfs, the cache manager's invariants hold each step, and every block is free after."""
    tokens, preemptions = _run_random(policy)
    assert tokens == fcfs_random[0] and len(tokens) == 14
    assert preemptions + fcfs_random[1] > 0  # the pool was small enough to preempt
