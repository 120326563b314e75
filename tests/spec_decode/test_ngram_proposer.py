"""The vectorised n-gram proposer against a plain-Python model of prompt lookup, and `SpeculativeConfig`'s checks."""

from __future__ import annotations

import numpy as np
import pytest

from jaxpaged.engine import EngineConfig
from jaxpaged.spec_decode import NgramProposer, SpeculativeConfig


def lookup_reference(tokens: list[int], k: int, min_n: int, max_n: int, limit: int) -> list[int]:
    """Longest suffix first (max_n down to min_n); its first earlier occurrence; the k tokens after it."""
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + min(k, limit)]
    return []


@pytest.mark.parametrize("k,min_n,max_n", [(4, 1, 4), (3, 2, 3), (1, 1, 1)])
def test_proposer_equals_python_reference(k, min_n, max_n):
    rng = np.random.default_rng(k * 10 + min_n)
    proposer = NgramProposer(k, min_n, max_n)
    for _ in range(20):
        batch = []
        for _ in range(rng.integers(1, 9)):
            vocab = int(rng.integers(2, 6))  # small vocabularies repeat: matches of every length occur
            batch.append(rng.integers(0, vocab, rng.integers(1, 40)).tolist())
        limits = rng.integers(-1, k + 2, len(batch)).tolist()  # a limit <= 0 proposes nothing
        got = proposer.propose(batch, limits)
        want = [lookup_reference(t, k, min_n, max_n, max(limit, 0)) for t, limit in zip(batch, limits)]
        assert got == want


def test_proposer_takes_k_tokens_in_a_loop():
    assert NgramProposer(3, 1, 2).propose([[5, 1, 2, 1, 2, 1, 2]], [3]) == [[1, 2, 1]]


def test_proposer_window_bounds_the_lookup():
    proposer = NgramProposer(2, 1, 2, window=8)
    tokens = [7, 8, 9] + [1] * 10 + [7, 8]  # the only earlier [7, 8] lies outside the last 8 tokens
    assert proposer.propose([tokens], [2]) == [[]]


def test_speculative_config_checks():
    assert SpeculativeConfig.from_value('{"num_speculative_tokens": 2}').num_speculative_tokens == 2
    config = EngineConfig(speculative_config={"method": "ngram", "prompt_lookup_max": 3})
    assert config.speculative_config == SpeculativeConfig(prompt_lookup_max=3) and config.async_scheduling
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig(method="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=0)
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        SpeculativeConfig(prompt_lookup_min=3, prompt_lookup_max=2)
    with pytest.raises(ValueError, match="unknown keys"):
        SpeculativeConfig.from_value({"num_lookahead": 2})
    with pytest.raises(ValueError, match="JSON"):
        SpeculativeConfig.from_value("{ngram")
    with pytest.raises(ValueError, match="method='draft_model'"):
        SpeculativeConfig(model="small")
    with pytest.raises(ValueError, match="needs speculative_config.model"):
        SpeculativeConfig(method="draft_model")
    assert SpeculativeConfig.from_value({"method": "draft_model", "model": "tiny"}).model == "tiny"
    with pytest.raises(ValueError, match="disable_by_batch_size"):
        SpeculativeConfig(disable_by_batch_size=0)
    assert SpeculativeConfig.from_value('{"disable_by_batch_size": null}').disable_by_batch_size is None
