"""The simulated device in real time: the engine over a `SleepingDeviceRunner`, and `jaxpaged serve --device=simulated`."""

from __future__ import annotations

import openai
import pytest

from jaxpaged.bench.online.online_client import fetch_metric
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.config import load_config
from jaxpaged.engine import EngineConfig
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import get_profile
from jaxpaged.sim.realtime import simulated_device_engine
from jaxpaged.sim.runner import fixed_token

MODEL, PROFILE = "llama3-8b", "h200-141gb"


def test_pool_is_what_the_device_memory_leaves_after_the_weights():
    engine = simulated_device_engine(EngineConfig(model=MODEL), PROFILE)
    c = load_config(MODEL)
    free = 0.9 * get_profile(PROFILE).memory_bytes - 2 * c.num_params()  # bf16 weights
    bf16_block = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 2 * 16
    assert engine.num_blocks == int(free // bf16_block)
    fp8 = simulated_device_engine(EngineConfig(model=MODEL, kv_cache_dtype="fp8_e4m3"), PROFILE)
    assert fp8.num_blocks == int(free // (bf16_block // 2))


def test_device_time_is_the_cost_models_for_each_step_it_ran():
    """One 40-token prompt, 6 tokens: a prefill step, then 5 decodes at growing contexts."""
    engine = simulated_device_engine(EngineConfig(model=MODEL, async_scheduling=False), PROFILE)
    prompt, max_tokens = list(range(100, 140)), 6
    engine.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                                   detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    runner = engine.runner
    runner.close()
    assert outputs[0].outputs[0].token_ids == [fixed_token(load_config(MODEL))] * max_tokens
    cost = CostModel(load_config(MODEL), get_profile(PROFILE), block_size=16)
    expected = cost.step_time([(len(prompt), 0)]) + sum(
        cost.step_time([(1, len(prompt) + i)]) for i in range(max_tokens - 1))
    assert runner.device_s == pytest.approx(expected, rel=1e-9)
    assert runner.num_steps == max_tokens
    assert runner.busy_s >= runner.device_s  # each step slept at least its predicted time


@pytest.mark.parametrize("changes, message", [
    (dict(tensor_parallel_size=2), "tensor_parallel_size"),
    (dict(model="tiny-does-not-exist"), "unknown model config"),
])
def test_bad_simulated_deployments_are_value_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        simulated_device_engine(EngineConfig(**{"model": MODEL, **changes}), PROFILE)


def test_unknown_profile_is_a_value_error():
    with pytest.raises(ValueError, match="unknown device profile"):
        simulated_device_engine(EngineConfig(model=MODEL), "tpu-v9")


def test_server_streams_at_the_simulated_device_and_exports_its_busy_time():
    with ServerProcess([f"--device=simulated", f"--model={MODEL}", f"--device_profile={PROFILE}"]) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        chunks = list(client.completions.create(model=MODEL, prompt="hello there", max_tokens=16, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(text) == 16 and finish == ["length"]
        generated = fetch_metric(server.base_url, "jaxpaged:generation_tokens_total")
        busy = fetch_metric(server.base_url, "jaxpaged:device_busy_seconds_total")
    assert generated == 16
    # The device slept at least the predicted time of the prefill and the 15 decodes that followed it.
    prompt_len = chunks[-1].usage.prompt_tokens
    cost = CostModel(load_config(MODEL), get_profile(PROFILE), block_size=16)
    predicted = cost.step_time([(prompt_len, 0)]) + sum(cost.step_time([(1, prompt_len + i)]) for i in range(15))
    assert busy >= predicted


@pytest.mark.parametrize("params, field", [
    (SamplingParams(max_tokens=2, prompt_logprobs=1), "prompt_logprobs"),
    (SamplingParams(max_tokens=2, beam_width=2), "beam_width"),
])
def test_what_needs_real_logits_is_refused_on_a_simulated_device(params, field):
    engine = simulated_device_engine(EngineConfig(model=MODEL), PROFILE)
    with pytest.raises(ValueError, match=field):
        engine.add_request("r", [1, 2, 3], params)
    assert not engine.has_unfinished_requests()
    engine.runner.close()
