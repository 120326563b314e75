"""The simulation driver: arrivals in simulated time, multiturn follow-ups, fixed tokens, sweeps."""

import dataclasses

import pytest

from jaxpaged.config import load_config
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler import SchedulerOutput
from jaxpaged.sequence import Request, Sequence
from jaxpaged.sim.runner import SimClock, SimulatedRunner, fixed_token
from jaxpaged.sim.scenario import Deployment, SweepPoint, run_at_rate, sustainable_rate
from jaxpaged.sim.workloads import make_workload

TINY = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=200 * 4 * 256, block_size=4,
                  max_num_seqs=8, max_num_batched_tokens=64)  # 200 blocks of 4 tokens (256 B per token)


def test_clock_only_moves_forward():
    clock = SimClock(1.0)
    clock.advance(0.5)
    clock.advance_to(1.2)  # earlier than now: no change
    assert clock() == 1.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_fixed_token_is_never_eos():
    cfg = load_config("tiny")
    assert fixed_token(cfg) != cfg.eos_token_id
    assert fixed_token(cfg.replace(eos_token_id=0)) == 1


def _seqs(count):
    request = Request("r", [1, 2, 3], SamplingParams(), arrival_time=0.0, arrival_order=0)
    return [Sequence(request, [1, 2, 3], i) for i in range(count)]


def test_simulated_runner_allocates_nothing_and_samples_the_fixed_token():
    cfg = load_config("tiny")
    clock = SimClock()
    runner = SimulatedRunner(cfg, TINY.cost_model(), clock, num_blocks=8)
    step = SchedulerOutput(seqs=_seqs(2), starts=[0, 7], num_tokens=[3, 1], samples=[True, True],
                           token_ids=[1, 2, 3, 4])
    handle = runner.execute_model(step)
    assert clock() == 0  # dispatched: the clock moves when the host waits for the result
    assert handle.result().token_ids.tolist() == [fixed_token(cfg)] * 2
    one = TINY.cost_model().step_time([(3, 0), (1, 7)])
    assert clock() == pytest.approx(one)
    assert runner.num_compiles == 0


def test_simulated_steps_dispatched_ahead_run_back_to_back():
    """Asynchronous scheduling: the next step is dispatched before the host waits for the current one."""
    cfg = load_config("tiny")
    clock = SimClock()
    runner = SimulatedRunner(cfg, TINY.cost_model(), clock, num_blocks=8)
    step = SchedulerOutput(seqs=_seqs(1), starts=[5], num_tokens=[1], samples=[True], token_ids=[1])
    first = runner.execute_model(step)
    second = runner.execute_model(step)  # queued behind the first on the simulated device
    one = TINY.cost_model().step_time([(1, 5)])
    first.result()
    assert clock() == pytest.approx(one)
    second.result()
    assert clock() == pytest.approx(2 * one) and runner.busy_s == pytest.approx(2 * one)


def test_poisson_arrivals_in_simulated_time():
    requests = make_workload("chatbot", num_requests=30, system_len=32, user_len=24, output_len=8)
    result = run_at_rate(TINY, requests, rate=50.0, seed=1)
    assert len(result.records) == 30
    assert all(r.ttft > 0 and r.e2e_latency >= r.ttft for r in result.records)
    arrivals = sorted(r.arrival_time for r in result.records)
    assert arrivals[0] > 0 and arrivals[-1] > arrivals[0]  # spread out, not all at once
    assert result.duration_s >= result.busy_s / 2  # the clock covers the device's work
    assert result.output_tokens == 30 * 8
    assert result.prefix_hit_rate > 0  # the shared system prompt hits


def test_multiturn_turns_extend_the_previous_answer():
    requests = make_workload("multiturn", num_requests=8, num_turns=4, user_len=12, output_len=6)
    result = run_at_rate(TINY, requests, rate=0)
    by_id = {r.request_id: r for r in result.records}
    first, last = by_id["multiturn-c0-t0"], by_id["multiturn-c0-t3"]
    assert last.arrival_time >= first.arrival_time + first.e2e_latency  # waited for the earlier turns
    assert last.num_prompt_tokens > first.num_prompt_tokens + 3 * 6  # history: prompts and answers
    assert last.num_cached_tokens > 0  # and the history is in the prefix cache


def test_prefix_caching_off_computes_every_prompt_token():
    requests = make_workload("chatbot", num_requests=10, system_len=32, user_len=24, output_len=4)
    off = run_at_rate(dataclasses.replace(TINY, enable_prefix_caching=False), requests, rate=0)
    on = run_at_rate(TINY, requests, rate=0)
    assert off.prefix_hit_rate == 0 and on.prefix_hit_rate > 0
    assert on.busy_s < off.busy_s


def _point(rate, p99):
    return SweepPoint(rate, rate, p99 / 2, p99, 0.01, 0.0, 0, 0.0)


def test_sustainable_rate_is_the_last_rate_under_the_bound():
    points = [_point(1, 0.1), _point(2, 0.5), _point(4, 3.0), _point(3, 0.9), _point(8, 0.2)]
    assert sustainable_rate(points, 1.0) == 3  # 8 passes again but 4 failed before it
    assert sustainable_rate(points, 0.05) is None


def test_weights_that_do_not_fit_are_reported():
    fp16_70b = Deployment(model="llama3-70b", profile="a100-80gb", weight_bytes_per_param=2.0)
    assert fp16_70b.weight_bytes() > 140e9
    with pytest.raises(ValueError, match="no room"):
        fp16_70b.num_blocks()
    w4 = Deployment(model="llama3-70b", profile="a100-80gb", weight_bytes_per_param=0.5, kv_cache_bytes=45 * 10**9)
    assert w4.num_blocks() == 45 * 10**9 // (16 * 327_680) == 8583


def test_simulation_collects_cycles_rarely_and_restores_the_gc_threshold():
    import gc

    from jaxpaged.sim.gc_tuning import SIM_GC_THRESHOLD, collect_cycles_rarely

    before = gc.get_threshold()
    seen = []
    with collect_cycles_rarely():
        seen.append(gc.get_threshold())
    assert seen[0][0] == max(before[0], SIM_GC_THRESHOLD) and seen[0][1:] == before[1:]
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), collect_cycles_rarely():
        raise RuntimeError("a failed simulation still restores the threshold")
    assert gc.get_threshold() == before


def test_finished_requests_are_freed_without_the_cycle_collector():
    """Requests and sequences point at each other; the engine breaks that when it hands out the output."""
    import gc
    import weakref

    from jaxpaged.outputs import RequestOutputKind
    from jaxpaged.sampling_params import SamplingParams
    from jaxpaged.sim.driver import make_sim_engine

    engine, _ = make_sim_engine(TINY.engine_config(), TINY.model_config, TINY.cost_model())
    engine.add_request("r", list(range(1, 20)), SamplingParams(max_tokens=5, ignore_eos=True, temperature=0,
                                                                output_kind=RequestOutputKind.FINAL_ONLY))
    request, seq = engine._requests["r"], engine._requests["r"].seqs[0]
    request_ref, seq_ref = weakref.ref(request), weakref.ref(seq)
    del request, seq
    gc.disable()
    try:
        outputs = []
        while engine.has_unfinished_requests():
            outputs += engine.step()
        assert [o.request_id for o in outputs] == ["r"] and len(outputs[0].outputs[0].token_ids) == 5
        del outputs
        engine.step()  # the last step's batch (stats.last_step_batch) lets go of its sequences
        assert request_ref() is None and seq_ref() is None
    finally:
        gc.enable()
