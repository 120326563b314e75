"""Complete validation: every bad parameter is refused up front, and no request's parameters can make `step()` raise."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxpaged import SamplingParams
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import sequence_seed

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
GOOD_PROMPTS = ([3, 14, 15, 92, 65], [27, 18, 28])


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=float("nan")), "temperature must be finite, got nan"),
    (dict(temperature=float("inf")), "temperature must be finite"),
    (dict(temperature=-0.5), "temperature must be at least 0"),
    (dict(temperature="1"), "temperature must be a number"),
    (dict(top_p=float("nan")), "top_p must be finite"),
    (dict(top_p=0.0), "top_p must be greater than 0"),
    (dict(top_p=1.5), "top_p must be at most 1"),
    (dict(length_penalty=float("nan")), "length_penalty must be finite"),
    (dict(length_penalty="x"), "length_penalty must be a number"),
    (dict(top_k=0), "top_k must be -1"),
    (dict(kv_source=5), "kv_source must be an endpoint string of 1 to 256 characters"),
    (dict(kv_source="tcp://" + "h" * 300), "kv_source must be an endpoint string of 1 to 256 characters"),
    (dict(top_k=-2), "top_k must be at least -1"),
    (dict(top_k=2**40), "top_k must be at most"),
    (dict(top_k=2.0), "top_k must be an integer"),
    (dict(n=2.5), "n must be an integer"),
    (dict(n=True), "n must be an integer"),
    (dict(n=0), "n must be at least 1"),
    (dict(max_tokens=False), "max_tokens must be an integer"),
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(beam_width=1.0), "beam_width must be an integer"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(seed="abc"), "seed must be an integer"),
    (dict(seed=-1), "seed must be at least 0"),
    (dict(seed=2**64), "seed must be at most"),
    (dict(stop_token_ids="12"), "stop_token_ids must be a list"),
    (dict(stop_token_ids=7), "stop_token_ids must be a list"),
    (dict(stop_token_ids=[1, 2.5]), "stop_token_ids entry must be an integer"),
    (dict(stop_token_ids=[-3]), "stop_token_ids entry must be at least 0"),
    (dict(ignore_eos=1), "ignore_eos must be True or False"),
    (dict(detokenize="no"), "detokenize must be True or False"),
    (dict(beam_width=2, n=2), "beam search"),
    (dict(output_kind="delta"), "output_kind"),
])
def test_sampling_params_refuse_bad_values_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_normalise_numeric_types():
    params = SamplingParams(n=np.int64(2), temperature=1, top_p=np.float32(0.5), seed=np.uint64(2**63),
                            stop_token_ids=np.array([3, 4]))
    assert type(params.n) is int and type(params.temperature) is float and type(params.seed) is int
    assert params.stop_token_ids == (3, 4)


def test_distinct_seeds_give_distinct_device_seeds():
    seeds = [0, 1, 2**32, 2**32 + 1, 2**63, 2**64 - 1]
    device = {(sequence_seed(s, i)) for s in seeds for i in range(4)}
    assert len(device) == len(seeds) * 4
    assert all(0 <= d < 2**32 for d in device)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_model_len=0), "max_model_len must be at least 1"),
    (dict(max_model_len=-5), "max_model_len must be at least 1"),
    (dict(block_size=2.5), "block_size must be an integer"),
    (dict(block_size=0), "block_size must be at least 1"),
    (dict(block_size=True), "block_size must be an integer"),
    (dict(num_blocks=0), "num_blocks must be at least 1"),
    (dict(num_blocks="8"), "num_blocks must be an integer"),
    (dict(kv_cache_bytes=-1), "kv_cache_bytes must be at least 1"),
    (dict(max_num_seqs=0), "max_num_seqs must be at least 1"),
    (dict(max_num_batched_tokens=1.5), "max_num_batched_tokens must be an integer"),
    (dict(seed=-1), "seed must be at least 0"),
    (dict(kv_scale_margin=float("nan")), "kv_scale_margin must be finite"),
    (dict(kv_scale_margin=0.5), "kv_scale_margin must be at least 1.0"),
    (dict(disk_cache_bytes=0), "disk_cache_bytes must be at least 1"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching must be True or False"),
    (dict(async_scheduling=1), "async_scheduling must be True or False"),
    (dict(hash_algo=5), "hash_algo must be a str"),
    (dict(model=None), "model must be a str"),
    (dict(disk_cache_dir=3, host_cache_bytes=1 << 20), "disk_cache_dir must be a path"),
])
def test_engine_config_refuses_bad_values_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_engine_config_accepts_nan_pool_fill():
    assert math.isnan(EngineConfig(pool_fill_value=float("nan")).pool_fill_value)


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(EngineConfig(model="tiny", block_size=4, num_blocks=48, max_model_len=64,
                               max_num_seqs=8), model=tiny_model)


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Each good prompt's greedy output from a fresh engine of its own."""
    outs = {}
    for prompt in GOOD_PROMPTS:
        fresh = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=48, max_model_len=64),
                       model=tiny_model)
        fresh.add_request("ref", prompt, GREEDY)
        outs[tuple(prompt)] = _drain(fresh)["ref"].outputs[0].token_ids
    return outs


def _drain(engine, limit=400):
    outs = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            return outs
        for out in engine.step():
            outs[out.request_id] = out
    raise AssertionError("the engine did not finish its requests")


@pytest.mark.parametrize("salt", [1.5, ["a"], b"x", 7])
def test_cache_salt_must_be_a_str(engine, salt):
    with pytest.raises(ValueError, match="cache_salt must be a str"):
        engine.add_request("salted", [1, 2, 3], GREEDY, cache_salt=salt)
    with pytest.raises(ValueError, match="cache_salt must be a str"):
        engine.add_request("salted", {"prompt_token_ids": [1, 2, 3], "cache_salt": salt}, GREEDY)
    assert not engine.has_unfinished_requests()


def test_top_k_and_beam_width_bounded_by_the_vocabulary(engine):
    vocab = engine.model_config.vocab_size
    with pytest.raises(ValueError, match=f"top_k must be -1 or at most the vocabulary size \\({vocab}\\)"):
        engine.add_request("k", [1, 2], SamplingParams(top_k=vocab + 1))
    with pytest.raises(ValueError, match="beam_width .* too large for the vocabulary"):
        engine.add_request("b", [1, 2], SamplingParams(beam_width=vocab, max_tokens=1))
    with pytest.raises(ValueError, match="params must be a SamplingParams"):
        engine.add_request("p", [1, 2], {"temperature": 0})
    with pytest.raises(ValueError, match="request_id must be a str"):
        engine.add_request(5, [1, 2], GREEDY)
    assert not engine.has_unfinished_requests()


HOSTILE_INTS = st.one_of(st.integers(-3, 6), st.sampled_from([2**31, 2**40, 2**64, -2**63]),
                         st.booleans(), st.floats(allow_nan=True), st.text(max_size=2), st.none())
HOSTILE_FLOATS = st.one_of(st.floats(-2, 3), st.floats(allow_nan=True, allow_infinity=True),
                           st.integers(-2, 3), st.booleans(), st.text(max_size=2), st.none())
PARAMS = st.fixed_dictionaries({}, optional={
    "n": HOSTILE_INTS, "temperature": HOSTILE_FLOATS, "top_k": HOSTILE_INTS, "top_p": HOSTILE_FLOATS,
    "seed": st.one_of(HOSTILE_INTS, st.integers(0, 2**64 - 1)), "max_tokens": HOSTILE_INTS,
    "beam_width": st.one_of(st.integers(1, 3), HOSTILE_INTS), "length_penalty": HOSTILE_FLOATS,
    "stop_token_ids": st.one_of(st.lists(HOSTILE_INTS, max_size=3), st.text(max_size=3)),
    "ignore_eos": st.one_of(st.booleans(), HOSTILE_INTS),
})
PROMPTS = st.one_of(
    st.lists(st.integers(0, 255), min_size=1, max_size=40),
    st.lists(st.one_of(st.integers(-5, 300), st.floats(), st.text(max_size=1)), max_size=6),
    st.text(max_size=8),
    st.fixed_dictionaries({"prompt_token_ids": st.lists(st.integers(0, 255), min_size=1, max_size=8),
                           "cache_salt": st.one_of(st.text(max_size=3), HOSTILE_FLOATS)}),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(requests=st.lists(st.tuples(PROMPTS, PARAMS, st.one_of(st.none(), st.text(max_size=2), HOSTILE_FLOATS)),
                         min_size=1, max_size=4))
def test_hostile_requests_never_make_step_raise(engine, reference, requests):
    """Each hostile request is refused on construction or by add_request, or runs to completion;
    meanwhile the well-formed greedy requests' outputs equal a fresh engine's."""
    for i, prompt in enumerate(GOOD_PROMPTS):
        engine.add_request(f"good-{i}", prompt, GREEDY)
    accepted = []
    for j, (prompt, kwargs, salt) in enumerate(requests):
        try:
            params = SamplingParams(**kwargs)
        except ValueError:
            continue
        if params.max_tokens > 8:  # keep the example short: the bound is validated, not the length
            params = SamplingParams(**{**kwargs, "max_tokens": 8})
        try:
            engine.add_request(f"hostile-{j}", prompt, params, cache_salt=salt)
        except ValueError:
            continue
        accepted.append(f"hostile-{j}")
    outs = _drain(engine)  # raises if any step raises
    for i, prompt in enumerate(GOOD_PROMPTS):
        assert outs[f"good-{i}"].outputs[0].token_ids == reference[tuple(prompt)]
    assert all(outs[name].finished for name in accepted)
    assert engine.kv.stats.num_used_blocks == 0
