"""EngineConfig checks every field once, on creation, and each refusal names the field it refuses."""

import dataclasses
import re

import numpy as np
import pytest

from jaxpaged.config import DEFAULT_BLOCK_SIZE, load_config
from jaxpaged.engine import EngineBuilder, EngineConfig
from jaxpaged.engine.config import MAX_NUM_BLOCKS
from jaxpaged.sim.runner import SimClock, SimulatedRunner
from jaxpaged.sim.scenario import Deployment

# one value per field that EngineConfig alone must refuse (no model needed); a new field needs one here
BAD_VALUE = {
    "model": 3,
    "block_size": 0,
    "cpu_compiler_options": "onednn",  # not a preset: it crashed and cannot enter the compile cache
    "cpu_gemm": "mkl",
    "num_blocks": -1,
    "kv_cache_bytes": 0,
    "enable_prefix_caching": "yes",
    "prefix_cache_snapshot": 7,
    "save_prefix_cache_on_shutdown": 1,
    "max_num_seqs": 0,
    "max_num_batched_tokens": 2.5,
    "max_model_len": 0,
    "async_scheduling": None,
    "attention_backend": "cuda",
    "pallas_interpret": "no",
    "kv_cache_dtype": "int4",
    "dtype": "float64",
    "seed": -1,
    "hash_algo": "md5",
    "pool_fill_value": "nan",
    "kv_layout": "ring",
    "kv_scales": 1.0,
    "kv_scale_margin": 0.5,
    "host_cache_bytes": 0,
    "disk_cache_dir": 5,
    "disk_cache_bytes": 0,
    "preemption_mode": "teleport",
    "scheduling_policy": "lottery",
    "tensor_parallel_size": 0,
    "eviction_policy": "random",
    "kv_cache_metrics_sample": 1.5,
    "compile_cache_dir": 8,
    "speculative_config": 5,
    "kv_role": "middle",
    "kv_transport": "rdma",
    "kv_listen": 7,
    "kv_peers": 7,  # (kv_listen and kv_peers are ignored while kv_role is "none")
    "kv_outbox_blocks": 0,
    "kv_transfer_timeout_s": 0.0,
    "kv_serve_delay_s": -1.0,
}
# what a field needs beside it so that only the field itself is wrong
CONTEXT = {"disk_cache_dir": {"host_cache_bytes": 1 << 20}}


def test_every_field_has_a_refusal_case():
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert fields == set(BAD_VALUE), f"add a bad value for {sorted(fields - set(BAD_VALUE))}"


@pytest.mark.parametrize("field", sorted(BAD_VALUE))
def test_each_refusal_names_its_field(field):
    with pytest.raises(ValueError) as err:
        EngineConfig(**CONTEXT.get(field, {}), **{field: BAD_VALUE[field]})
    assert re.match(rf"{field}\b", str(err.value)), str(err.value)


@pytest.mark.parametrize("kwargs, field, limit", [
    (dict(save_prefix_cache_on_shutdown=True), "save_prefix_cache_on_shutdown", "prefix_cache_snapshot"),
    (dict(disk_cache_dir="/tmp/d"), "disk_cache_dir", "host_cache_bytes"),
    (dict(preemption_mode="swap"), "preemption_mode", "host_cache_bytes"),
    (dict(host_cache_bytes=1 << 20, kv_layout="contiguous"), "host_cache_bytes", "kv_layout='paged'"),
    (dict(kv_role="prefill", enable_prefix_caching=False), "kv_role", "enable_prefix_caching"),
    (dict(speculative_config={}, kv_layout="contiguous"), "speculative_config",
     "kv_layout='paged'"),
])
def test_combinations_name_both_fields(kwargs, field, limit):
    with pytest.raises(ValueError) as err:
        EngineConfig(**kwargs)
    assert field in str(err.value) and limit in str(err.value)


@pytest.mark.parametrize("kwargs", [
    dict(kv_cache_dtype="fp8_e4m3"), dict(kv_cache_dtype="auto"), dict(dtype="bf16"), dict(dtype=None),
    dict(attention_backend="xla_reference"), dict(hash_algo="xxh3_128"), dict(eviction_policy="sieve"),
    dict(host_cache_bytes=1 << 20, preemption_mode="swap", disk_cache_dir="/tmp/d"),
    dict(kv_scales=([1.0], [1.0])),  # the shapes are checked against the model when the engine is built
])
def test_good_values_pass(kwargs):
    EngineConfig(**kwargs)


def test_the_block_size_default_is_the_library_one():
    assert EngineConfig().block_size == DEFAULT_BLOCK_SIZE


@pytest.mark.parametrize("kwargs, field", [
    (dict(kv_cache_bytes=100), "kv_cache_bytes"),  # less than one block of the tiny model
    (dict(kv_cache_bytes=1 << 40), "kv_cache_bytes"),  # more blocks of the tiny model than MAX_NUM_BLOCKS
    (dict(num_blocks=8, kv_scales=(np.ones((1, 1)), np.ones((1, 1)))), "kv_scales"),  # not [layers, kv heads]
])
def test_checks_that_need_the_model_name_the_field_too(kwargs, field):
    model_config = load_config("tiny")
    runner = SimulatedRunner(model_config, Deployment(model="tiny").cost_model(), SimClock(), num_blocks=8)
    with pytest.raises(ValueError) as err:
        EngineBuilder(EngineConfig(model="tiny", block_size=DEFAULT_BLOCK_SIZE, **kwargs), runner=runner).build()
    assert re.match(rf"{field}\b", str(err.value)), str(err.value)


def test_the_block_count_is_capped_where_the_pool_is_sized():
    """A pool past MAX_NUM_BLOCKS is refused by count and by budget, naming what to change and the limit."""
    assert EngineConfig(num_blocks=MAX_NUM_BLOCKS).num_blocks == MAX_NUM_BLOCKS
    with pytest.raises(ValueError, match=rf"^num_blocks must be at most {MAX_NUM_BLOCKS}"):
        EngineConfig(num_blocks=MAX_NUM_BLOCKS + 1)
    tiny = Deployment(model="tiny", profile="a100-80gb", block_size=4)  # 90% of 80 GB in 1 KB blocks: ~75M
    assert tiny.memory_utilization * tiny.device.memory_bytes // tiny.block_bytes() > MAX_NUM_BLOCKS
    with pytest.raises(ValueError, match=rf"at most {MAX_NUM_BLOCKS}.*kv_cache_bytes"):
        tiny.num_blocks()
    sized = dataclasses.replace(tiny, kv_cache_bytes=1 << 20)
    assert sized.num_blocks() == (1 << 20) // 1024


def _simulated_tiny(num_blocks: int = 8) -> SimulatedRunner:
    return SimulatedRunner(load_config("tiny"), Deployment(model="tiny").cost_model(), SimClock(), num_blocks=num_blocks)


@pytest.mark.parametrize("kv_layout", ["paged", "contiguous"])
@pytest.mark.parametrize("asked", [1000, 100])
def test_build_returns_the_effective_max_model_len_and_changes_nothing_it_was_given(kv_layout, asked):
    """The longest sequence is the asked one cut to what the pool holds (one group of 8 blocks of 16 tokens:
    128), returned in the parts; the config and the builder are left as they were given."""
    config = EngineConfig(model="tiny", num_blocks=8, kv_layout=kv_layout, max_model_len=asked)
    builder = EngineBuilder(config, runner=_simulated_tiny())
    given = dict(vars(builder))
    parts = builder.build()
    assert parts.max_model_len == min(asked, 8 * DEFAULT_BLOCK_SIZE)
    assert vars(builder) == given and config.max_model_len == asked
    assert builder.build().max_model_len == parts.max_model_len  # built again: the same numbers


@pytest.mark.parametrize("kwargs, field", [
    (dict(host_cache_bytes=1 << 20), "host_cache_bytes"),
    (dict(prefix_cache_snapshot="unused-snapshot-dir"), "prefix_cache_snapshot"),
    (dict(kv_role="decode"), "kv_role"),
    (dict(async_scheduling=False, speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
     "speculative_config"),
])
def test_a_config_the_runner_declares_it_cannot_serve_is_refused_naming_the_field(kwargs, field):
    """The simulated runner declares no pool and no draft verification (`RunnerCapabilities`)."""
    runner = _simulated_tiny()
    assert not runner.capabilities.owns_kv_pool and not runner.capabilities.verifies_drafts
    with pytest.raises(ValueError, match=rf"^{field} needs "):
        EngineBuilder(EngineConfig(model="tiny", num_blocks=8, **kwargs), runner=runner).build()
