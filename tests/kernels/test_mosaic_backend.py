"""`attention_backend="pallas_mosaic"` through the model: the Mosaic GPU kernel (GPU
interpret mode on CPU, race detector on; compiled with `JAXPAGED_PALLAS_INTERPRET=0`)
inside the jitted, donated model step gives the logits and greedy tokens of the XLA
backend on the same bf16 weights."""

from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.attention import resolve_backend
from jaxpaged.attention import backend as backend_module
from jaxpaged.attention.backend import _kernel, mosaic_gpu_available
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner
from tests.kernels.paged_batches import make_batch
from tests.paged_driver import drive

pytestmark = pytest.mark.skipif(not mosaic_gpu_available(), reason="this JAX has no Mosaic GPU backend")
INTERPRET = os.environ.get("JAXPAGED_PALLAS_INTERPRET", "1") != "0"


@pytest.fixture(scope="module")
def bf16_model(tiny_config):
    """The tiny Llama, one layer, with head_dim 64 (the Mosaic kernel's minimum) in bfloat16."""
    config = dataclasses.replace(tiny_config, name="tiny-d64", head_dim=64, num_layers=1, dtype="bfloat16")
    return init_model(config, seed=0)


def test_model_steps_match_xla(bf16_model):
    prompts = [list(range(5, 22)), list(range(100, 103))]  # the second joins a step later: mixed steps
    runs = {}
    for name in ("xla", "pallas_mosaic"):
        backend = resolve_backend(name, interpret=INTERPRET)
        runner = ModelRunner(bf16_model, num_blocks=24, block_size=16, backend=backend, pool_fill_value=float("nan"))
        runs[name] = drive(runner, prompts, max_new=2, chunk=16, rng=np.random.default_rng(0))
    for xla, mosaic in zip(runs["xla"], runs["pallas_mosaic"]):
        assert mosaic.tokens == xla.tokens
        for pos, row in xla.logits.items():
            np.testing.assert_allclose(mosaic.logits[pos], row, atol=5e-2, rtol=5e-2)


def test_shapes_it_does_not_take_go_to_the_triton_kernel():
    """float32 queries (the Mosaic kernel takes 16-bit ones) run the Triton kernel instead."""
    batch = make_batch([20, 5], [1, 1], block_size=16, group=4)  # float32, head_dim 32
    mosaic = batch.run(_kernel(resolve_backend("pallas_mosaic", interpret=INTERPRET)))
    triton = batch.run(_kernel(resolve_backend("pallas", interpret=INTERPRET)))
    np.testing.assert_array_equal(np.asarray(mosaic), np.asarray(triton))
    assert mosaic.dtype == jnp.float32


class _FakeGpu:
    platform = "gpu"

    def __init__(self, compute_capability):
        self.compute_capability = compute_capability


@pytest.mark.parametrize("capability,expected", [("9.0", "pallas_mosaic"), ("8.0", "pallas"), ("10.0", "pallas")])
def test_auto_on_a_gpu_picks_mosaic_on_hopper_only(monkeypatch, capability, expected):
    monkeypatch.setattr(backend_module.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(backend_module.jax, "devices", lambda: [_FakeGpu(capability)])
    monkeypatch.delenv(backend_module.BACKEND_ENV, raising=False)
    assert resolve_backend("auto").name == expected


def test_environment_overrides_auto(monkeypatch):
    """`$JAXPAGED_ATTENTION_BACKEND` (like VLLM_ATTENTION_BACKEND) replaces auto's choice, checked."""
    monkeypatch.setenv(backend_module.BACKEND_ENV, "xla_reference")
    assert resolve_backend("auto").name == "xla_reference"
    assert resolve_backend("xla").name == "xla"  # an explicit name wins
    monkeypatch.setenv(backend_module.BACKEND_ENV, "triton")
    with pytest.raises(ValueError, match=backend_module.BACKEND_ENV):
        resolve_backend("auto")
