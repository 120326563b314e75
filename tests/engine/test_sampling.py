"""On-device sampling: the distribution it draws from, its filters, and per-request seeds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.runner.sampling import SamplingBatch, first_argmax, sample, token_logprobs
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


def test_a_rows_token_does_not_depend_on_which_path_the_step_takes():
    """Greedy-only, unfiltered and filtered steps run different code; a row they can all serve gets one token."""
    rng = np.random.default_rng(0)
    rows, vocab = 64, 300
    logits = jnp.asarray(rng.normal(size=(rows, vocab)) * 3, jnp.float32)

    def draw(temperature, top_k, top_p):
        batch = SamplingBatch(jnp.asarray(temperature, jnp.float32), jnp.asarray(top_k, jnp.int32),
                              jnp.asarray(top_p, jnp.float32), jnp.arange(rows, dtype=jnp.uint32),
                              jnp.full(rows, 7, jnp.int32))
        return np.asarray(_sample(logits, batch)[0])

    half = np.arange(rows) < rows // 2
    unfiltered = draw(np.ones(rows), np.full(rows, -1), np.ones(rows))  # no sort
    mixed = draw(np.ones(rows), np.where(half, -1, 5), np.ones(rows))  # the second half filters: sort path
    np.testing.assert_array_equal(mixed[half], unfiltered[half])
    top5 = np.argsort(-np.asarray(logits), axis=-1)[:, :5]
    assert all(mixed[i] in top5[i] for i in np.nonzero(~half)[0])
    greedy_only = draw(np.zeros(rows), np.full(rows, -1), np.ones(rows))
    mixed_greedy = draw(np.where(half, 0.0, 1.0), np.full(rows, -1), np.ones(rows))
    np.testing.assert_array_equal(greedy_only, np.argmax(np.asarray(logits), axis=-1))
    np.testing.assert_array_equal(mixed_greedy[half], greedy_only[half])
    np.testing.assert_array_equal(mixed_greedy[~half], unfiltered[~half])


def test_first_argmax_and_token_logprobs_match_numpy():
    """The CPU argmax (max, then least index) breaks ties and meets NaN as np.argmax does; the chosen
    token's log-probability equals the full log-softmax's entry."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 1000)).astype(np.float32)
    x[1, [5, 700]] = 9.0  # a tie: the first index wins
    x[2, :] = -np.inf
    x[2, 40] = 0.0  # one finite entry among -inf
    x[3, [17, 900]] = np.nan  # NaN counts as the maximum, first one wins
    ids = np.asarray(jax.jit(first_argmax)(jnp.asarray(x)))
    np.testing.assert_array_equal(ids, np.argmax(x, axis=-1))
    finite = jnp.asarray(x[[0, 1, 2, 4, 5]])
    tokens = jnp.asarray([3, 700, 40, 999, 0], jnp.int32)
    expected = jnp.take_along_axis(jax.nn.log_softmax(finite, axis=-1), tokens[:, None], axis=-1)[:, 0]
    np.testing.assert_allclose(np.asarray(token_logprobs(finite, tokens)), np.asarray(expected), atol=1e-5)
