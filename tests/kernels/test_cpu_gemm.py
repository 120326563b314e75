"""The oneDNN GEMM over the XLA FFI (`jaxpaged.model.cpu_gemm`) against `jnp.dot`, and the model routed through it."""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged import cpu_kernels
from jaxpaged.model import cpu_gemm

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU custom call")

EVERY_ROW = cpu_gemm.GemmRoute(rows=(("float32", 1, 1 << 30), ("bfloat16", 1, 1 << 30)))
# relative to the largest |result|: bfloat16 results are rounded to 8 bits of mantissa
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


def test_the_gemm_builds_here():
    """The suite installs the `cpu` extra (oneDNN): the kernel must build, or the tests below mean nothing."""
    assert cpu_gemm.available()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("m, k, n", [(1, 17, 33), (3, 50, 7), (64, 129, 260)])
@pytest.mark.parametrize("transpose_w", [False, True])
def test_gemm_equals_jnp_dot(dtype, m, k, n, transpose_w):
    """Odd shapes (one row, K and N not multiples of 16), both weight layouts, float32 accumulation. The PyPI
    oneDNN has no bfloat16 matmul on an AVX2-only CPU: skipped where `available` says so (the fallback is
    `test_a_dtype_onednn_cannot_run_here_stays_xlas`)."""
    if not cpu_gemm.available(dtype):
        pytest.skip(f"oneDNN has no {jnp.dtype(dtype).name} matmul on this CPU")
    x = jax.random.normal(jax.random.key(m), (m, k), dtype)
    w = jax.random.normal(jax.random.key(n), (n, k) if transpose_w else (k, n), dtype)
    got = jax.jit(lambda x, w: cpu_gemm.gemm(x, w, transpose_w=transpose_w))(x, w)
    want = jnp.dot(x, w.T if transpose_w else w, preferred_element_type=jnp.float32)
    assert got.shape == (m, n) and got.dtype == dtype
    scale = float(jnp.max(jnp.abs(want)))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=TOLERANCE[dtype] * scale, rtol=0)


def test_gemm_refuses_mixed_or_unsupported_dtypes():
    x = jnp.ones((2, 4), jnp.float32)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        cpu_gemm.gemm(x, jnp.ones((4, 3), jnp.bfloat16))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        cpu_gemm.gemm(x.astype(jnp.float16), jnp.ones((4, 3), jnp.float16))


def test_the_route_takes_only_its_dtypes_and_row_counts():
    route = cpu_gemm.GemmRoute(rows=(("float32", 1, 64),))
    assert route.takes(jnp.float32, 1) and route.takes("float32", 64)
    assert not route.takes(jnp.float32, 65) and not route.takes(jnp.bfloat16, 2)
    x, w = jnp.ones((2, 8), jnp.float32), jnp.ones((8, 4), jnp.float32)
    hlo = jax.jit(lambda x, w: cpu_gemm.dot_general(route, x, w, (((1,), (0,)), ((), ())))).lower(
        x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)).as_text()
    assert cpu_gemm.TARGET not in hlo  # bfloat16 is not routed: XLA's dot
    hlo = jax.jit(lambda x, w: cpu_gemm.dot_general(route, x, w, (((1,), (0,)), ((), ())))).lower(x, w).as_text()
    assert cpu_gemm.TARGET in hlo


def test_a_dtype_onednn_cannot_run_here_stays_xlas(monkeypatch):
    """Where oneDNN builds no bfloat16 matmul (an AVX2-only CPU), `available(bfloat16)` is False, `auto` and
    `onednn` route no bfloat16 product, and `gemm` refuses it by name; float32 is unaffected."""
    from jaxpaged.runner import cpu_step
    monkeypatch.setattr(cpu_gemm, "_supports", lambda name: name != "bfloat16")
    assert cpu_gemm.available(jnp.float32) and not cpu_gemm.available(jnp.bfloat16)
    assert cpu_step.gemm_route("auto", "cpu", "bfloat16") is None
    assert cpu_step.gemm_route("onednn", "cpu", "bfloat16") is None
    assert cpu_step.gemm_route("onednn", "cpu", "float32") is not None
    with pytest.raises(RuntimeError, match="bfloat16 is not available"):
        cpu_gemm.gemm(jnp.ones((2, 4), jnp.bfloat16), jnp.ones((4, 3), jnp.bfloat16))


def test_a_routed_model_gives_the_dense_forward_of_the_original(tiny_config):
    """Every projection and the LM head go through oneDNN in the routed copy (tied and untied heads); the
    original model is unchanged and the logits agree."""
    from jaxpaged.model import init_model
    for tied in (False, True):
        config = dataclasses.replace(tiny_config, tie_embeddings=tied)
        model = init_model(config, seed=1)
        routed = cpu_gemm.route_model(model, EVERY_ROW)
        ids = jnp.arange(10).reshape(2, 5) % config.vocab_size
        hlo = jax.jit(routed.forward_dense).lower(ids).as_text()
        assert hlo.count(cpu_gemm.TARGET) == 7 * config.num_layers + 1
        assert cpu_gemm.TARGET not in jax.jit(model.forward_dense).lower(ids).as_text()
        np.testing.assert_allclose(np.asarray(routed.forward_dense(ids)), np.asarray(model.forward_dense(ids)),
                                   atol=1e-4, rtol=1e-4)


def test_without_onednn_the_gemm_is_unavailable_and_warns(monkeypatch, caplog):
    """Where the oneDNN wheels are missing, `available()` is False with one warning, and nothing is routed."""
    def missing(distribution, suffix):
        raise OSError(f"the {distribution} package is not installed")
    monkeypatch.setattr(cpu_gemm, "_wheel_file", missing)
    cpu_gemm._registered.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=cpu_gemm.__name__):
            assert not cpu_gemm.available()
            assert not cpu_gemm.available()
        assert sum("XLA's dot is used" in r.message for r in caplog.records) == 1
    finally:
        monkeypatch.undo()
        cpu_gemm._registered.cache_clear()
    assert cpu_gemm.available()
    assert cpu_kernels.cache_dir().exists()
