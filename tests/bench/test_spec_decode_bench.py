"""`bench spec-decode`'s library: modes side by side on one workload, medians, ratios, the token check."""

import pytest

from jaxpaged.bench.offline.spec_decode import run_spec_decode_bench, spec_decode_table, workload_messages
from jaxpaged.engine import Engine, EngineConfig

LOOP = [5, 6, 7, 8] * 6


def _engine(speculative=None, seed=0):
    return Engine(EngineConfig(model="tiny", block_size=4, num_blocks=128, async_scheduling=False, seed=seed,
                               speculative_config=speculative))


def test_modes_side_by_side_with_acceptance_lengths():
    engines = {"off": _engine(), "on": _engine({"method": "ngram", "disable_by_batch_size": None}),
               "default": _engine({"method": "ngram", "disable_by_batch_size": 2})}
    rows = run_spec_decode_bench(engines, {"loop": [LOOP, LOOP[1:]]}, [1, 2], output_len=20, repeats=2)
    assert [(r.workload, r.batch_size) for r in rows] == [("loop", 1), ("loop", 2)]
    for row in rows:
        off, on = row.summaries["off"], row.summaries["on"]
        assert off["spec_decode_mean_acceptance_length"] == 1.0 < on["spec_decode_mean_acceptance_length"] <= 5.0
        assert row.ratio("output_token_throughput") == on["output_token_throughput"] / off["output_token_throughput"]
    # disable_by_batch_size=2: the batch of 2 never speculates, the batch of 1 does
    assert rows[1].summaries["default"]["spec_decode_mean_acceptance_length"] == 1.0
    assert rows[0].summaries["default"]["spec_decode_mean_acceptance_length"] > 1.0
    table = spec_decode_table(rows)
    assert table.count("\n") == 2 + 6 - 1 and "| loop | 2 | default |" in table


def test_a_mode_with_other_tokens_is_an_error():
    engines = {"off": _engine(), "other weights": _engine(seed=1)}
    with pytest.raises(RuntimeError, match="greedy tokens differ"):
        run_spec_decode_bench(engines, {"loop": [LOOP]}, [1], output_len=4, repeats=1)


def test_workload_prompts_ask_for_copies_and_chat():
    assert len(workload_messages("repetition")) == 6
    assert all("Copy the following paragraph" in m[0]["content"] or "Rename the variable" in m[0]["content"]
               for m in workload_messages("repetition"))
    assert len(workload_messages("chat")) == 8
