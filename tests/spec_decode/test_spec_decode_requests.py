"""Which requests speculate: greedy and sampled ones (beside each other in a batch); a grammar is refused."""

from __future__ import annotations

import pytest

from jaxpaged.bench.offline.driver import run_workload, summarize
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.metrics import EngineMetrics
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.workloads import WorkloadRequest
from jaxpaged.structured.params import StructuredOutputsParams

LOOP = [5, 6, 7, 8] * 6  # a repetitive prompt: prompt lookup always has a proposal


def run(speculative: dict | None) -> tuple[Engine, dict[str, list[int]]]:
    engine = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=64, async_scheduling=False,
                                 speculative_config=speculative))
    engine.add_request("greedy", LOOP, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.add_request("sampled", LOOP, SamplingParams(temperature=1.0, seed=3, max_tokens=20, ignore_eos=True))
    engine.add_request("short", LOOP[:9], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
        engine.kv.check_invariants()
    assert engine.kv.stats.num_free_blocks == engine.num_blocks
    return engine, finals


@pytest.fixture(scope="module")
def runs():
    return run(None), run({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None})


def test_mixed_batch_equals_speculation_off(runs):
    (_, want), (spec, got) = runs
    assert got == want
    assert len(got["short"]) == 2 and len(got["greedy"]) == 20  # max_tokens never exceeded by accepted drafts
    assert spec.stats.spec_num_drafts > 0


def test_prometheus_counters_as_vllm_names_them(runs):
    _, (spec, _) = runs
    metrics = EngineMetrics()
    metrics(spec, [])
    values = metrics.snapshot()
    stats = spec.stats
    assert values["jaxpaged:spec_decode_num_drafts_total"] == stats.spec_num_drafts > 0
    assert values["jaxpaged:spec_decode_num_draft_tokens_total"] == stats.spec_num_draft_tokens
    accepted = values["jaxpaged:spec_decode_num_accepted_tokens_total"]
    per_position = "jaxpaged:spec_decode_num_accepted_tokens_per_pos"
    assert accepted == sum(v for k, v in values.items() if k.startswith(per_position))
    assert 0 < accepted <= stats.spec_num_draft_tokens
    per_pos = stats.spec_accepted_per_position  # a draft is accepted only after every one before it
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:])) and per_pos[0] <= stats.spec_num_drafts


def test_grammar_is_refused_and_nothing_is_disturbed(runs):
    _, (spec, _) = runs
    params = SamplingParams(temperature=0, max_tokens=4, structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    with pytest.raises(ValueError, match="structured_outputs is not supported with speculative decoding"):
        spec.add_request("grammar", LOOP, params)
    assert not spec.has_unfinished_requests() and spec.kv.stats.num_free_blocks == spec.num_blocks


def test_benchmark_summary_reports_mean_acceptance_length(runs):
    (plain, _), (spec, _) = runs
    workload = [WorkloadRequest("w0", LOOP, 12)]
    plain_summary = summarize(run_workload(plain, workload))
    drafts_before = spec.stats.spec_num_drafts
    summary = summarize(run_workload(spec, workload))
    assert plain_summary["spec_decode_mean_acceptance_length"] == 1.0  # no speculation: one token per step
    assert spec.stats.spec_num_drafts > drafts_before  # the workload's request speculated
    # the record keeps the engine's running totals: the length covers both runs of this engine
    total_drafts, total_accepted = spec.stats.spec_num_drafts, spec.stats.spec_num_accepted_tokens
    assert summary["spec_decode_mean_acceptance_length"] == pytest.approx(1 + total_accepted / total_drafts)


def test_disable_by_batch_size_turns_speculation_off_for_large_batches():
    """No draft in a step that starts with `disable_by_batch_size` or more running sequences; below it, drafts."""
    engine = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=64, async_scheduling=False,
                                 speculative_config={"method": "ngram", "disable_by_batch_size": 2}))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.add_request("long", LOOP, params)
    engine.add_request("short", LOOP, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    drafts_by_running = {}
    while engine.has_unfinished_requests():
        running, before = len(engine.scheduler.running), engine.stats.spec_num_drafts
        engine.step()
        drafts_by_running[running] = drafts_by_running.get(running, 0) + engine.stats.spec_num_drafts - before
    assert drafts_by_running[2] == 0 and drafts_by_running[1] > 0
