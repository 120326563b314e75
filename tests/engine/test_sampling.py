"""On-device sampling: the distribution it draws from, its filters, and per-request seeds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.sampling import SamplingBatch, sample
from jaxpaged.sampling_params import SamplingParams

ROWS = 6000
_sample = jax.jit(sample)


def _draw(logits, temperature=1.0, top_k=-1, top_p=1.0, seed=0):
    batch = SamplingBatch(
        temperature=jnp.full(ROWS, temperature, jnp.float32), top_k=jnp.full(ROWS, top_k, jnp.int32),
        top_p=jnp.full(ROWS, top_p, jnp.float32), seeds=jnp.full(ROWS, seed, jnp.uint32),
        counters=jnp.arange(ROWS, dtype=jnp.int32))
    tokens, _ = _sample(jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (ROWS, len(logits))), batch)
    return np.bincount(np.asarray(tokens), minlength=len(logits)) / ROWS


LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15]))


def test_temperature_one_draws_from_softmax():
    freq = _draw(LOGITS)
    np.testing.assert_allclose(freq, np.exp(LOGITS), atol=0.025)


def test_temperature_sharpens():
    freq = _draw(LOGITS, temperature=0.5)
    expected = np.exp(2 * LOGITS) / np.exp(2 * LOGITS).sum()
    np.testing.assert_allclose(freq, expected, atol=0.025)


def test_top_k_and_top_p_restrict_support():
    assert set(np.nonzero(_draw(LOGITS, top_k=2))[0]) == {1, 3}
    # sorted probs .4 .3 .15 .1 .05: mass before each = 0 .4 .7 .85 .95; top_p=.7 keeps the first two
    freq = _draw(LOGITS, top_p=0.7)
    assert set(np.nonzero(freq)[0]) == {1, 3}
    np.testing.assert_allclose(freq[[1, 3]], [0.4 / 0.7, 0.3 / 0.7], atol=0.025)


def test_greedy_and_seeds():
    assert np.argmax(_draw(LOGITS, temperature=0.0)) == 1 and _draw(LOGITS, temperature=0.0)[1] == 1.0
    assert np.array_equal(_draw(LOGITS, seed=5), _draw(LOGITS, seed=5))
    assert not np.array_equal(_draw(LOGITS, seed=5), _draw(LOGITS, seed=6))


@pytest.mark.parametrize("bad", [
    dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=0), dict(top_k=-2),
    dict(n=0), dict(max_tokens=0), dict(beam_width=0)])
def test_invalid_sampling_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
