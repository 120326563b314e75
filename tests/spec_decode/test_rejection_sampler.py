"""The verifier's rejection sampling keeps the target distribution; greedy rows match the argmax.

Each test verifies thousands of rows of the same logits with distinct
counters (the index of the token a row decides), so the rows are independent
draws; a chi-square goodness-of-fit test compares their tokens with the
target distribution computed here in numpy (seeds fixed: the test is
deterministic).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import chisquare

from jaxpaged.runner.rejection import NO_DRAFT, verify_draft_tokens
from jaxpaged.runner.sampling import SamplingBatch, sample

ROWS = 6000
PROBS = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
LOGITS = np.log(PROBS)
_verify = jax.jit(verify_draft_tokens)
_sample = jax.jit(sample)


def batch(temperature=1.0, top_k=-1, top_p=1.0, seed=0, rows=ROWS) -> SamplingBatch:
    return SamplingBatch(jnp.full(rows, temperature, jnp.float32), jnp.full(rows, top_k, jnp.int32),
                         jnp.full(rows, top_p, jnp.float32), jnp.full(rows, seed, jnp.uint32),
                         jnp.arange(rows, dtype=jnp.int32), jnp.zeros(rows, jnp.float32))


def verify(drafts, **params) -> np.ndarray:
    logits = jnp.broadcast_to(jnp.asarray(LOGITS, jnp.float32), (ROWS, len(LOGITS)))
    tokens, _ = _verify(logits, jnp.asarray(np.broadcast_to(drafts, ROWS), jnp.int32), batch(**params))
    return np.asarray(tokens)


def target(temperature=1.0, keep=None) -> np.ndarray:
    """The target distribution after temperature and a support filter (numpy, independent of the sampler)."""
    p = np.exp(LOGITS / temperature)
    if keep is not None:
        p = np.where(np.isin(np.arange(len(p)), keep), p, 0.0)
    return p / p.sum()


def assert_distributed_as(tokens: np.ndarray, probs: np.ndarray) -> None:
    counts = np.bincount(tokens, minlength=len(probs))
    support = probs > 0
    assert counts[~support].sum() == 0, f"tokens outside the target's support: {counts}"
    result = chisquare(counts[support], probs[support] * len(tokens))
    assert result.pvalue > 1e-3, f"counts {counts} vs expected {probs * len(tokens)}: p={result.pvalue:.2g}"


def test_a_point_mass_draft_keeps_the_target_distribution():
    for draft in (1, 0):  # the likeliest token (accepted ~40%) and an unlikely one (~5%)
        tokens = verify(draft)
        assert_distributed_as(tokens, target())
        accepted = np.mean(tokens == draft)
        assert abs(accepted - PROBS[draft]) < 0.03  # accepted with probability p(draft), not more often


def test_a_draft_under_temperature_and_filters_keeps_the_filtered_distribution():
    # temperature 0.5, top-k 3: support {1, 3, 4}; a draft outside it (token 2) is never accepted
    assert_distributed_as(verify(2, temperature=0.5, top_k=3), target(0.5, keep=[1, 3, 4]))
    # top-p 0.7 keeps {1, 3}
    assert_distributed_as(verify(3, top_p=0.7), target(1.0, keep=[1, 3]))


def test_drafts_drawn_from_the_target_still_give_the_target():
    """Drafts that vary by row (drawn from another distribution) leave the emitted tokens' law unchanged."""
    drafts = np.random.default_rng(0).choice(len(PROBS), ROWS, p=[0.5, 0.1, 0.1, 0.1, 0.2])
    assert_distributed_as(verify(drafts), target())


def test_a_row_without_a_draft_draws_what_plain_sampling_draws():
    """Same seed and counter: the verifier's last row of a span and the plain sampler give the same token."""
    for params in (dict(), dict(temperature=0.7, top_k=3), dict(top_p=0.8, seed=9)):
        logits = jnp.broadcast_to(jnp.asarray(LOGITS, jnp.float32), (ROWS, len(LOGITS)))
        plain, _ = _sample(logits, batch(**params))
        np.testing.assert_array_equal(verify(NO_DRAFT, **params), np.asarray(plain))


def test_greedy_rows_return_the_argmax_whatever_the_draft():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(ROWS, len(PROBS))) * 3, jnp.float32)
    drafts = jnp.asarray(rng.integers(-1, len(PROBS), ROWS), jnp.int32)
    tokens, logprobs = _verify(logits, drafts, batch(temperature=0.0))
    np.testing.assert_array_equal(np.asarray(tokens), np.argmax(np.asarray(logits), axis=-1))
    expected = jax.nn.log_softmax(logits, axis=-1)[jnp.arange(ROWS), tokens]
    np.testing.assert_allclose(np.asarray(logprobs), np.asarray(expected), rtol=1e-6)


def test_a_certain_draft_is_always_accepted_and_seeds_reproduce():
    assert np.all(verify(1, top_k=1) == 1)  # p(draft) = 1
    assert np.array_equal(verify(3, seed=4), verify(3, seed=4))
    assert not np.array_equal(verify(3, seed=4), verify(3, seed=5))
