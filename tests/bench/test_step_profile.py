"""Splitting a traced step's time by the code that emitted each XLA op."""

import pytest

from jaxpaged.bench.offline.step_profile import CATEGORIES, category_of, leaf_op_seconds, op_call_stacks, profile_step
from jaxpaged.config import load_config
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input

HLO = """HloModule m

FileNames
1 "model.py"

FunctionNames
1 "step"
2 "MLP.__call__"
3 "Linear.__call__"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=1 function_name_id=2 line=20 end_line=20 column=1 end_column=2}
3 {file_name_id=1 function_name_id=3 line=30 end_line=30 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}

ENTRY %main (p: f32[2]) -> f32[2] {
  %dot.1 = f32[2]{0} fusion(%p), kind=kCustom, metadata={op_name="dot_general" stack_frame_id=3}
  ROOT %add.2 = f32[2]{0} add(%dot.1, %p), metadata={op_name="add" stack_frame_id=1}
}
"""


def test_call_stacks_walk_from_the_op_to_the_root():
    stacks = op_call_stacks(HLO)
    assert stacks == {"dot.1": ["Linear.__call__", "MLP.__call__", "step"], "add.2": ["step"]}
    assert category_of(stacks["dot.1"]) == CATEGORIES["MLP.__call__"]
    assert category_of(stacks["add.2"]) == "other"


def test_only_leaf_spans_count():
    def span(name, ts, dur, tid=1):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}

    events = [span("cond.1", 0, 100), span("dot.1", 10, 30), span("add.2", 50, 20),
              span("dot.1", 200, 5, tid=2), span("unknown", 300, 999)]
    seconds = leaf_op_seconds(events, {"cond.1", "dot.1", "add.2"})
    assert seconds == pytest.approx({"dot.1": 35e-6, "add.2": 20e-6})  # cond.1 holds other ops


@pytest.fixture
def no_compile_cache():
    """The parts come from the function names in the executable's metadata, which the persistent compile cache's
    key leaves out: an executable cached before a rename would name the old functions (and one an earlier test
    loaded from that cache stays in this process's own cache)."""
    import jax

    from jaxpaged import compile_cache
    before = compile_cache.resolve_cache_dir(compile_cache.AUTO)
    compile_cache.configure(None)
    jax.clear_caches()
    yield
    compile_cache.configure(before)


def test_a_real_step_splits_into_its_parts(no_compile_cache):
    runner = ModelRunner(init_model(load_config("tiny")), num_blocks=32, block_size=16)
    step = build_step_input([ScheduledSeq([5], 40, [3 * i, 3 * i + 1, 3 * i + 2]) for i in range(4)], 16)
    parts = profile_step(runner, step, repeats=2)
    for part in ("attention", "MLP", "LM head", "K/V write", "sampling", "q/k/v projection + RoPE", "RMSNorm"):
        assert parts.get(part, 0.0) > 0, (part, parts)
    assert set(parts) <= set(CATEGORIES.values()) | {"other"}
