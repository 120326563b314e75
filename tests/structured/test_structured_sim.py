"""Structured output over the stand-in device of the host-overhead benchmark: its constrained rows draw a
random token their mask allows, so the real host path (deferred masks, matchers) runs without a model."""

from __future__ import annotations

import json

import jsonschema

from jaxpaged.bench.offline.synthetic_tokenizer import synthetic_bpe_tokenizer
from jaxpaged.checkpoint import model_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import get_profile
from jaxpaged.sim.sleeping_runner import SleepingDeviceRunner
from jaxpaged.structured import StructuredOutputsParams
from tests.structured.structured_cases import SCHEMAS


def test_stand_in_device_serves_constrained_rows_from_their_masks():
    config = model_config("tiny")
    tokenizer = synthetic_bpe_tokenizer(config.vocab_size)
    runner = SleepingDeviceRunner(config, CostModel(config, get_profile("h200-141gb"), block_size=16), 256,
                                  sleep=False)
    runner.avoid_tokens |= set(tokenizer.stop_token_ids)
    for overlapped in (True, False):
        runner.reset()
        engine = Engine(EngineConfig(model="tiny", block_size=16, num_blocks=256, async_scheduling=overlapped),
                        runner=runner, tokenizer=tokenizer)
        schemas = SCHEMAS[19:27]
        for i, schema in enumerate(schemas):
            engine.add_request(str(i), [1, 2, 3], SamplingParams(max_tokens=200, structured_outputs=
                                                                 StructuredOutputsParams(json=schema,
                                                                                         disable_any_whitespace=True)))
        done = {}
        while engine.has_unfinished_requests():
            done.update({o.request_id: o for o in engine.step() if o.finished})
        for i, schema in enumerate(schemas):
            completion = done[str(i)].outputs[0]
            assert completion.finish_reason == "stop"
            jsonschema.validate(json.loads(completion.text), schema)


def test_host_overhead_measures_constrained_decodes():
    from jaxpaged.bench.offline.host_overhead import measure_host_overhead
    run = measure_host_overhead(8, model="tiny", profile="a100-80gb", context_len=40, steps=4, warmup_steps=2,
                                sleep=False, structured=True)
    # every one of the 8 rows kept decoding under its never-ending grammar through the measured steps
    assert run.structured and run.num_steps == 4 and run.num_seqs == 8
    assert min(run.schedule_ms, run.update_ms, run.host_ms) > 0
