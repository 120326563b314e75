"""Prefill and decode pools in the simulator: transfer cost, TTFT, pulled blocks, SLO accounting, no drift."""

import dataclasses
import math
import random

import pytest

from jaxpaged.router import make_policy
from jaxpaged.sim.cluster import simulate_cluster
from jaxpaged.sim.disaggregated import Pools, simulate_pools
from jaxpaged.sim.driver import make_sim_engine, simulate
from jaxpaged.sim.kv_link import KVLink, LinkSchedule
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.slo import SLO, attainment
from jaxpaged.sim.traces import load_trace, trace_workload
from jaxpaged.sim.workloads import WorkloadRequest, assign_arrivals, make_workload

BS = 4
TINY = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=200 * BS * 256, block_size=BS,
                  max_num_seqs=8, max_num_batched_tokens=64)  # 200 blocks of 4 tokens (256 B per token)
LINK = KVLink(bandwidth_per_device=1e6)  # slow enough that transfers are a visible part of TTFT
SMALL = dict(user_len=16, output_len=8)


def _tiny_kv_bytes_per_token() -> int:
    """configs/tiny.json: 2 layers, 2 KV heads of 16 dims; K and V at 2 bytes an element."""
    return 2 * 2 * 2 * 16 * 2


def _requests(workload: str, n: int, rate: float, seed: int = 1) -> list[WorkloadRequest]:
    scales = dict(system_len=24, **SMALL) if workload == "chatbot" else SMALL
    return assign_arrivals(make_workload(workload, num_requests=n, seed=seed, **scales), rate, seed)


def _copies(requests):
    return [dataclasses.replace(r) for r in requests]


def test_transfer_cost_is_bytes_over_bandwidth():
    link = KVLink(bandwidth_per_device=25e9, latency_s=0.0)
    assert link.transfer_seconds(0) == 0.0
    assert link.transfer_seconds(5e9) == 5e9 / 25e9
    assert link.transfer_seconds(8e9, num_shards=8) == 1e9 / 25e9  # each device moves its KV heads' share
    assert KVLink(1e9, latency_s=0.5).transfer_seconds(1e9) == 1.5
    # in a run: each request's bytes are its pulled tokens' K/V, its time those bytes over the link
    prompt = list(range(1, 4 * BS + 2))  # 4 full blocks and one token
    result = simulate_pools(TINY, Pools(prefill=1, decode=1), [WorkloadRequest("r", prompt, 3)], link=LINK)
    (record,) = result.records
    assert record.pulled_tokens == 4 * BS
    assert record.transfer_bytes == 4 * BS * _tiny_kv_bytes_per_token()
    assert record.transfer_s == pytest.approx(4 * BS * _tiny_kv_bytes_per_token() / 1e6, rel=1e-12)
    assert record.transfer_wait_s == 0.0


def test_transfers_from_one_instance_wait_for_its_link():
    links = LinkSchedule()
    assert links.reserve("p0", "d0", 1.0, 2.0) == (1.0, 3.0)
    assert links.reserve("p0", "d1", 1.5, 1.0) == (3.0, 4.0)  # p0's outbound side is busy until 3
    assert links.reserve("p1", "d0", 2.0, 1.0) == (3.0, 4.0)  # d0's inbound side too
    assert links.reserve("p2", "d2", 2.0, 1.0) == (2.0, 3.0)
    assert links.reserve("p0", "d3", 9.0, 0.0) == (9.0, 9.0)  # nothing to move: no booking


def test_ttft_is_prefill_plus_transfer_plus_first_decode_step():
    prompt = list(range(1, 4 * BS + 2))  # 17 tokens: the prefill is one step, the decode side computes one
    result = simulate_pools(TINY, Pools(prefill=1, decode=1), [WorkloadRequest("r", prompt, 3)], link=LINK)
    (record,) = result.records
    cost = TINY.cost_model()
    prefill = cost.step_time([(len(prompt), 0)])
    transfer = 4 * BS * _tiny_kv_bytes_per_token() / 1e6
    first_decode = cost.step_time([(1, 4 * BS)])  # the last prompt token after 16 pulled ones
    assert record.prefill_done == pytest.approx(prefill, rel=1e-12)
    assert record.ttft == pytest.approx(prefill + transfer + first_decode, rel=1e-12)
    assert first_decode < cost.step_time([(len(prompt), 0)])  # the pulled tokens were not computed again
    later = [cost.step_time([(1, 4 * BS + 1 + i)]) for i in range(2)]  # the two tokens after the first
    assert record.tpot == pytest.approx(sum(later) / 2, rel=1e-12)
    assert record.num_cached_tokens == 0 and record.prefill_cached_tokens == 0


def test_decode_side_pulls_only_the_blocks_it_does_not_cache():
    shared = list(range(1, 6 * BS + 1))  # 6 blocks both prompts start with
    first = WorkloadRequest("a", shared + [100, 101, 102, 103, 104], 3)
    second = WorkloadRequest("b", shared + [200, 201, 202, 203, 204, 205, 206, 207, 208], 3, arrival_time=10.0)
    result = simulate_pools(TINY, Pools(prefill=1, decode=1), [first, second], link=LINK)
    a, b = sorted(result.records, key=lambda r: r.request_id)
    assert a.pulled_tokens == 7 * BS  # 29 tokens: 7 full blocks, none cached yet
    assert b.num_cached_tokens == 6 * BS  # the decode instance cached the first request's blocks
    assert b.pulled_tokens == (33 - 1) // BS * BS - 6 * BS  # only the blocks after the shared prefix
    assert b.transfer_bytes == b.pulled_tokens * _tiny_kv_bytes_per_token()
    assert b.prefill_cached_tokens == 6 * BS  # and the prefill instance hit them too
    # different tenants share nothing: the salt is in every block hash, on both sides
    salted = dataclasses.replace(second, cache_salt="other")
    result = simulate_pools(TINY, Pools(prefill=1, decode=1), [first, salted], link=LINK)
    b = next(r for r in result.records if r.request_id == "b")
    assert b.num_cached_tokens == 0 and b.pulled_tokens == 8 * BS and b.prefill_cached_tokens == 0
    assert result.decode_recomputed_tokens == 0


def test_pulls_follow_the_connectors_rule_against_a_plain_model_of_what_the_decode_side_holds():
    """Requests one after another, prompts drawn from a few shared prefixes: each pulls exactly its full
    blocks (all but the last token's) that no earlier prompt left on the decode side (the pool holds them all
    here), and its local hit is the rest; nothing crosses twice."""
    rng = random.Random(3)
    prefixes = [[rng.randrange(1, 200) for _ in range(3 * BS)] for _ in range(3)]
    prompts = [rng.choice(prefixes)[:rng.randrange(BS, 3 * BS + 1)] + [rng.randrange(1, 200)
                                                                      for _ in range(rng.randrange(1, 2 * BS))]
               for _ in range(12)]
    requests = [WorkloadRequest(f"r{i:02d}", p, 2, arrival_time=10.0 * i) for i, p in enumerate(prompts)]
    result = simulate_pools(TINY, Pools(prefill=1, decode=1), requests, link=LINK)
    held: set[tuple[int, ...]] = set()  # a block is its whole prefix (the chain its hash commits to)
    for record, prompt in zip(sorted(result.records, key=lambda r: r.request_id), prompts):
        restorable = [tuple(prompt[:(j + 1) * BS]) for j in range((len(prompt) - 1) // BS)]
        missing = [block for block in restorable if block not in held]
        assert record.pulled_tokens == len(missing) * BS
        assert record.num_cached_tokens == (len(restorable) - len(missing)) * BS
        held.update(tuple(prompt[:(j + 1) * BS]) for j in range(len(prompt) // BS))  # computed, then cached
    assert result.decode_recomputed_tokens == 0


def test_a_prefix_pushed_to_the_decode_sides_host_tier_is_not_pulled_again():
    """A pool of 12 blocks: the second prompt evicts the first one's blocks from the decode device into its
    host tier (a pool's worth, as a real decode engine's); the first prompt again pulls nothing and is restored."""
    small = dataclasses.replace(TINY, kv_cache_bytes=12 * BS * 256)
    first = list(range(1, 8 * BS + 2))  # 8 full blocks and one token
    other = list(range(100, 100 + 8 * BS + 1))
    requests = [WorkloadRequest("a", first, 2), WorkloadRequest("b", other, 2, arrival_time=10.0),
                WorkloadRequest("c", first, 2, arrival_time=20.0)]
    result = simulate_pools(small, Pools(prefill=1, decode=1), requests, link=LINK)
    a, b, c = sorted(result.records, key=lambda r: r.request_id)
    assert a.pulled_tokens == b.pulled_tokens == 8 * BS
    assert c.pulled_tokens == 0 and c.transfer_bytes == 0 and c.num_cached_tokens == 8 * BS
    assert c.ttft < a.ttft  # no transfer: the blocks came back from the host tier
    assert result.decode_recomputed_tokens == 0


@pytest.mark.parametrize("tbt_stat", ["mean", "p90", "max"])
def test_slo_attainment_and_goodput_match_a_recount_of_the_records(tbt_stat):
    result = simulate_pools(TINY, Pools(prefill=1, decode=2), _requests("chatbot", 40, rate=300.0), link=LINK)
    records = result.records
    assert len(records) == 40
    ttfts = sorted(r.ttft for r in records)
    field = {"mean": "tpot", "p90": "tbt_p90", "max": "tbt_max"}[tbt_stat]
    tbts = sorted(getattr(r, field) for r in records)
    first = min(r.arrival_time for r in records)
    last = max(r.arrival_time + r.e2e_latency for r in records)
    assert result.duration_s == last - first
    for ttft_s, tbt_s in [(ttfts[10], tbts[30]), (ttfts[35], tbts[5]), (1e3, 1e3), (ttfts[0] / 2, 1e3)]:
        slo = SLO(ttft_s, tbt_s, tbt_stat)
        good = 0
        ttft_ok = tbt_ok = 0
        for r in records:
            a = r.ttft <= ttft_s
            b = getattr(r, field) <= tbt_s
            ttft_ok += a
            tbt_ok += b
            good += a and b
        got = result.attainment(slo)
        assert (got.ttft, got.tbt, got.both) == (ttft_ok / 40, tbt_ok / 40, good / 40)
        assert got.goodput_rps == good / (last - first)
        assert result.summary(slo)["goodput_rps"] == got.goodput_rps
    for r in records:  # each statistic bounds the next
        assert r.tpot <= r.tbt_max and r.tbt_p90 <= r.tbt_max
    assert attainment([], SLO(1, 1), 0.0).goodput_rps == 0.0


@pytest.mark.parametrize("workload", ["chatbot", "multiturn"])
def test_colocated_reproduces_the_existing_simulators(workload):
    requests = _requests(workload, 24, rate=400.0)
    engine, clock = make_sim_engine(TINY.engine_config(), TINY.model_config, TINY.cost_model())
    single = simulate(engine, clock, _copies(requests), decode_fast_forward=False)
    one = simulate_pools(TINY, Pools(colocated=1), _copies(requests), link=LINK)
    by_id = lambda records: sorted(records, key=lambda r: r.request_id)
    assert by_id(r.request_record() for r in one.records) == by_id(single.records)
    cluster = simulate_cluster(TINY, 3, make_policy("prefix_aware"), _copies(requests))
    three = simulate_pools(TINY, Pools(colocated=3), _copies(requests), link=LINK, policy="prefix_aware")
    assert by_id(r.request_record() for r in three.records) == by_id(cluster.records)
    assert three.duration_s == cluster.duration_s
    assert all(r.transfer_bytes == 0 and r.prefill_instance is None for r in three.records)


def test_a_jump_does_not_admit_a_pulled_prompt_at_full_price():
    """On trace-sized prompts pulled requests reach decode instances mid-decode; a jump must not admit
    one (it would cost its whole prompt). The tiny workloads above do not reach that case."""
    deployment = Deployment(model="llama3-8b", profile="h200-141gb", kv_cache_bytes=int(2e9))
    requests = trace_workload(load_trace(limit=40), time_scale=0.5, max_model_len=8192)
    fast, slow = (simulate_pools(deployment, Pools(prefill=2, decode=1), _copies(requests), link=KVLink(50e9),
                                 decode_fast_forward=ff) for ff in (True, False))
    assert fast.records == slow.records


@pytest.mark.parametrize("workload", ["chatbot", "multiturn"])
@pytest.mark.parametrize("link", [LINK, KVLink(1e12)], ids=["slow_link", "fast_link"])
def test_decode_fast_forward_changes_nothing(workload, link):
    # long outputs: pulled requests reach decode instances that are running plain decodes
    requests = assign_arrivals(make_workload(workload, num_requests=40, seed=2, user_len=16, output_len=40), 300.0, 2)
    for pools in (Pools(colocated=2), Pools(prefill=2, decode=1)):
        fast, slow = (simulate_pools(TINY, pools, _copies(requests), link=link, decode_fast_forward=ff)
                      for ff in (True, False))
        assert fast.records == slow.records and fast.duration_s == slow.duration_s


def test_disaggregated_multiturn_finishes_every_turn():
    requests = _requests("multiturn", 30, rate=300.0)
    result = simulate_pools(TINY, Pools(prefill=2, decode=1), _copies(requests), link=LINK)
    assert sorted(r.request_id for r in result.records) == sorted(r.request_id for r in requests)
    later = [r for r in result.records if not r.request_id.endswith("-t0")]
    assert sum(r.num_cached_tokens for r in later) > 0  # later turns find their history on the decode side
    assert all(math.isfinite(r.ttft) and r.ttft >= r.prefill_done + r.transfer_s for r in result.records)


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "at least one prefill"), (dict(prefill=1), "at least one prefill"),
    (dict(colocated=2, decode=1), "not both"), (dict(colocated=-1), "non-negative"),
])
def test_bad_pools(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Pools(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(bandwidth_per_device=0), "bandwidth_per_device"), (dict(bandwidth_per_device=1, latency_s=-1), "latency_s"),
])
def test_bad_link(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVLink(**kwargs)


def test_bad_slo():
    with pytest.raises(ValueError, match="positive"):
        SLO(0, 1)
    with pytest.raises(ValueError, match="tbt_stat"):
        SLO(1, 1, "p50")
