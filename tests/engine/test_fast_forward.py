"""Decode fast-forward ends where stepping one step at a time ends: same engine, cache and clock state."""

import dataclasses
import functools
import math

import pytest

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.driver import make_sim_engine, simulate
from jaxpaged.sim.profiles import GPU_PROFILES, DeviceProfile
from jaxpaged.sim.runner import SimClock, SimulatedRunner
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.workloads import assign_arrivals, make_workload

TINY = load_config("tiny")
FINAL = RequestOutputKind.FINAL_ONLY  # the simulator's output kind: one output per request
# jaxpaged's padded XLA step on a CPU-like device: step times depend on the longest context
PADDED = DeviceProfile("padded-cpu", peak_flops=5e10, memory_bandwidth=3e9, step_overhead_s=0.01,
                       memory_bytes=1 << 30, padded_shapes=True, per_seq_overhead_s=2e-4, attention_flops=2e10)


def _engine(profile=GPU_PROFILES["a100-80gb"], **config):
    config = {"model": "tiny", "block_size": 4, "num_blocks": 120, "max_num_seqs": 16,
              "max_num_batched_tokens": 64, **config}
    clock = SimClock()
    runner = SimulatedRunner(TINY, CostModel(TINY, profile, block_size=config["block_size"]), clock,
                             num_blocks=config["num_blocks"])
    return Engine(EngineConfig(**config, async_scheduling=False), runner=runner, clock=clock)


def _add(engine, prompts, max_tokens):
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(f"r{i}", prompt,
                           SamplingParams(output_kind=FINAL, temperature=0, max_tokens=n, ignore_eos=True))


def _state(engine: Engine):
    """Everything a later step could depend on, block ids and float times included."""
    seqs = sorted(engine.scheduler.running, key=lambda s: s.seq_id)
    return {
        "clock": engine.clock(),
        "busy": engine.runner.busy_s,
        "runner_steps": engine.runner.num_steps,
        "stats": dataclasses.asdict(engine.stats),
        "batch": engine.stats.last_step_batch,
        "seqs": [(s.request.request_id, list(s.token_ids), s.num_computed_tokens, engine.kv.block_table(s.seq_id),
                  engine.kv.num_computed_tokens(s.seq_id), list(s.request.token_times),
                  s.request.peak_blocks_shared) for s in seqs],
        "cache": engine.kv.cached_blocks(),
        "kv_stats": engine.kv.stats,
        "free": engine.kv.num_free_blocks,
    }


def _outputs(outputs):
    return sorted((o.request_id, o.outputs[0].token_ids, o.outputs[0].finish_reason, o.metrics.token_times,
                   o.metrics.finish_time, o.metrics.peak_blocks_shared) for o in outputs)


@pytest.mark.parametrize("profile", [GPU_PROFILES["a100-80gb"], PADDED], ids=["roofline", "padded"])
def test_fast_forward_equals_stepping(profile):
    # shared 8-token prefix (two cached blocks), staggered lengths so requests finish at different steps,
    # contexts crossing block boundaries at different steps
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12] + [20 + i] * (3 + i) for i in range(6)]
    max_tokens = [9, 14, 23, 6, 30, 17]
    fast, slow = _engine(profile), _engine(profile)
    _add(fast, prompts, max_tokens)
    _add(slow, prompts, max_tokens)
    while not all(s.num_computed_tokens == s.num_tokens - 1 for s in fast.scheduler.running) \
            or fast.scheduler.waiting:
        fast.step()
        slow.step()
    assert _state(fast) == _state(slow)

    steps, fast_out = fast.fast_forward(until=slow.clock() + 12 * 3600)
    assert steps > 10
    slow_out = [o for _ in range(steps) for o in slow.step()]
    assert _state(fast) == _state(slow)
    assert _outputs(fast_out) == _outputs(slow_out)
    assert fast_out  # some requests finished inside the jump
    # what is left runs on alike
    while slow.has_unfinished_requests():
        n, out = fast.fast_forward()
        fast_out += out if n else fast.step()
        slow_out += slow.step()
    assert _outputs(fast_out) == _outputs(slow_out)
    assert fast.kv.cached_blocks() == slow.kv.cached_blocks()


def test_fast_forward_stops_at_the_deadline_and_before_a_preemption():
    engine = _engine(num_blocks=30)  # 8 requests outgrow 30 blocks of 4 tokens: someone must be preempted
    _add(engine, [[i + 3] * 5 for i in range(8)], [40] * 8)
    while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_tokens - 1 for s in engine.scheduler.running):
        engine.step()
    start = engine.clock()
    steps, _ = engine.fast_forward(until=start)
    assert steps == 0  # the deadline is now: not one step
    steps, _ = engine.fast_forward()
    assert steps > 0
    assert engine.scheduler.num_preemptions == 0
    needing = sum(1 for s in engine.scheduler.running
                  if s.num_computed_tokens + 1 > engine.kv.num_blocks_held(s.seq_id) * 4)
    assert needing > engine.kv.num_free_blocks  # it stopped because the next step would preempt
    engine.step()
    assert engine.scheduler.num_preemptions > 0


def test_fast_forward_declines_unless_every_sequence_decodes():
    engine = _engine()
    _add(engine, [[3] * 30, [4] * 5], [8, 8])
    assert engine.fast_forward() == (0, [])  # nothing running yet: both wait
    parallel = _engine()
    parallel.add_request("n2", [3] * 9,
                         SamplingParams(output_kind=FINAL, n=2, temperature=1.0, max_tokens=6, ignore_eos=True))
    while parallel.scheduler.waiting or parallel.scheduler.running[0].request.fork_pending:
        parallel.step()
    parallel.step()
    assert parallel.fast_forward() == (0, [])  # forked sequences share blocks: left to the scheduler


def _serve(engine, arrivals, fast: bool):
    """Submit `arrivals` (time, id, prompt, params) when due, as the driver does; step until all finish."""
    pending, outputs, calls = list(arrivals), [], 0

    def feed():
        while pending and pending[0][0] <= engine.clock():
            t, rid, prompt, params = pending.pop(0)
            engine.add_request(rid, prompt, params, arrival_time=t)
        return pending[0][0] if pending else math.inf

    while pending or engine.has_unfinished_requests():
        next_arrival = feed()
        if not engine.has_unfinished_requests():
            engine.clock.advance_to(next_arrival)
            continue
        steps = 0
        if fast:
            steps, out = engine.fast_forward(feed=feed)
        if not steps:
            calls += 1
            out = engine.step()
        outputs += out
    return outputs, calls


def _lockstep(arrivals, **config):
    """Serve `arrivals` on two engines, one jumping and one stepping the same steps; compare after each jump."""
    engines = fast, slow = _engine(**config), _engine(**config)
    pending = {id(e): list(arrivals) for e in engines}

    def feed_for(engine):
        def feed():
            queue = pending[id(engine)]
            while queue and queue[0][0] <= engine.clock():
                t, rid, prompt, params = queue.pop(0)
                engine.add_request(rid, prompt, params, arrival_time=t)
            return queue[0][0] if queue else math.inf
        return feed

    feed_fast, feed_slow = feed_for(fast), feed_for(slow)
    jumps = 0
    while pending[id(fast)] or fast.has_unfinished_requests():
        next_arrival = feed_fast()
        feed_slow()
        if not fast.has_unfinished_requests():
            fast.clock.advance_to(next_arrival)
            slow.clock.advance_to(next_arrival)
            continue
        steps, _ = fast.fast_forward(feed=feed_fast)
        jumps += steps > 1
        if not steps:
            fast.step()
        for i in range(max(steps, 1)):
            if i:
                feed_slow()  # the driver submits arrivals before every step
            slow.step()
        assert _state(fast) == _state(slow)
    return jumps


def test_admissions_inside_fast_forward_equal_stepping():
    greedy = functools.partial(SamplingParams, output_kind=FINAL, temperature=0, ignore_eos=True)
    step_s = CostModel(TINY, GPU_PROFILES["a100-80gb"]).step_time([(1, 10)])  # about one decode step
    shared = [9, 8, 7, 6, 5, 4, 3, 2]
    arrivals = [(0.0, "a", [11] * 6, greedy(max_tokens=40)), (0.0, "b", [12] * 9, greedy(max_tokens=33))]
    arrivals += [
        (3.5 * step_s, "c", shared + [1, 2], greedy(max_tokens=20)),  # admitted whole: becomes a lane
        (3.5 * step_s, "d", shared + [1, 2], greedy(max_tokens=20)),  # same prefix in flight: deferred a step
        (9.2 * step_s, "one", [13] * 7, greedy(max_tokens=1)),  # finishes in its admission step
        (14.1 * step_s, "long", [14] * 150, greedy(max_tokens=5)),  # more than the budget: chunked prefill
        (20.3 * step_s, "fork", [15] * 9, SamplingParams(output_kind=FINAL, n=2, temperature=1.0, seed=1,
                                                          max_tokens=4, ignore_eos=True)),
        (26.0 * step_s, "e", [16] * 12, greedy(max_tokens=12)),
    ]
    fast, slow = _engine(max_num_batched_tokens=64), _engine(max_num_batched_tokens=64)
    fast_out, fast_calls = _serve(fast, arrivals, fast=True)
    slow_out, slow_calls = _serve(slow, arrivals, fast=False)
    assert _outputs(fast_out) == _outputs(slow_out)
    assert [o.num_cached_tokens for o in sorted(fast_out, key=lambda o: o.request_id)] == \
        [o.num_cached_tokens for o in sorted(slow_out, key=lambda o: o.request_id)]
    assert _state(fast) == _state(slow)
    by_id = {o.request_id: o for o in fast_out}
    assert by_id["d"].num_cached_tokens == 8  # "d" waited a step for "c"'s blocks and hit them
    assert by_id["d"].metrics.first_scheduled_time > by_id["c"].metrics.first_scheduled_time
    assert len(by_id["fork"].outputs) == 2 and by_id["one"].outputs[0].token_ids == [0]
    assert fast_calls < slow_calls / 3  # most steps, admissions included, ran inside fast_forward
    assert _lockstep(arrivals, max_num_batched_tokens=64) >= 3  # and state matches after every jump


def test_last_step_batch_after_an_admission_then_quiet_steps():
    greedy = functools.partial(SamplingParams, output_kind=FINAL, temperature=0, ignore_eos=True)
    fast, slow = _engine(block_size=16, num_blocks=40), _engine(block_size=16, num_blocks=40)  # rare events
    for engine in (fast, slow):
        _add(engine, [[5] * 6, [6] * 7], [40, 40])
        engine.step()  # prefills: both decode from here
    deadline = fast.clock() + 6 * CostModel(TINY, GPU_PROFILES["a100-80gb"]).step_time([(1, 10), (1, 10)])

    added = []

    def feed():  # one arrival now, then nothing until after the deadline
        if not added:
            fast.add_request("new", [7] * 5, greedy(max_tokens=30))
            added.append("new")
        return deadline

    steps, _ = fast.fast_forward(feed=feed)
    slow.add_request("new", [7] * 5, greedy(max_tokens=30))
    for _ in range(steps):
        slow.step()
    assert steps > 2  # the admission step, then steps with no event, up to the deadline
    assert fast.stats.last_step_batch == slow.stats.last_step_batch
    assert [entry[0] for entry in fast.stats.last_step_batch] == ["r0", "r1", "new"]
    assert _state(fast) == _state(slow)


def test_a_prompt_one_token_from_done_is_not_a_decode():
    # budget 16 - 2 decodes: "c" computes 14 of its 15 prompt tokens, leaving one token to compute like a
    # decode; but that step computes a prompt token and samples the first output token (TTFT)
    greedy = functools.partial(SamplingParams, output_kind=FINAL, temperature=0, ignore_eos=True)
    step_s = CostModel(TINY, GPU_PROFILES["a100-80gb"]).step_time([(1, 10)])
    arrivals = [(0.0, "a", [11] * 5, greedy(max_tokens=30)), (0.0, "b", [12] * 5, greedy(max_tokens=30)),
                (5.5 * step_s, "c", [13] * 15, greedy(max_tokens=6))]
    fast, slow = _engine(max_num_batched_tokens=16), _engine(max_num_batched_tokens=16)
    fast_out, _ = _serve(fast, arrivals, fast=True)
    slow_out, _ = _serve(slow, arrivals, fast=False)
    assert _outputs(fast_out) == _outputs(slow_out)
    assert _state(fast) == _state(slow)
    assert all(o.metrics.first_token_time is not None for o in fast_out)


@pytest.mark.parametrize("workload,rate,caching", [("chatbot", 40.0, True), ("chatbot", 0.0, False),
                                                   ("multiturn", 20.0, True)])
def test_simulate_with_and_without_fast_forward_agree(workload, rate, caching):
    kwargs = {"multiturn": {"num_turns": 3, "user_len": 10, "output_len": 12},
              "chatbot": {"system_len": 24, "user_len": 10, "output_len": 20}}[workload]
    requests = assign_arrivals(make_workload(workload, num_requests=24, seed=5, **kwargs), rate, seed=2)
    deployment = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=60 * 4 * 256, block_size=4,
                            max_num_seqs=12, max_num_batched_tokens=48, enable_prefix_caching=caching)
    results, engines = [], []
    for ff in (True, False):
        engine, clock = make_sim_engine(deployment.engine_config(), deployment.model_config,
                                        deployment.cost_model())
        calls = []
        step = engine.step
        engine.step = lambda: calls.append(1) or step()
        results.append(simulate(engine, clock, requests, decode_fast_forward=ff))
        engines.append((engine, len(calls)))
    fast, slow = results
    assert fast.records == slow.records  # every request's times, to the bit
    assert (fast.num_steps, fast.busy_s, fast.num_preemptions, fast.prefix_hit_rate, fast.output_tokens) == \
        (slow.num_steps, slow.busy_s, slow.num_preemptions, slow.prefix_hit_rate, slow.output_tokens)
    assert engines[0][0].kv.cached_blocks() == engines[1][0].kv.cached_blocks()
    assert engines[0][0].kv.stats == engines[1][0].kv.stats
    assert engines[0][1] < engines[1][1]  # some steps were jumped over
    if rate == 0.0:
        assert slow.num_preemptions > 0  # the small pool made the scheduler preempt in between
