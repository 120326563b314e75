"""Sampled requests speculate through the engine: the target distribution is kept, seeds reproduce.

A random 16-token-vocabulary llama samples 4 tokens at temperature 0.3 for
300 seeds with n-gram speculation on, and for 300 other seeds with it off.
The prompt ends with the model's own greedy continuation, so prompt lookup
proposes drafts the target often accepts (about a third here) and often
rejects. A chi-square test of homogeneity per output position compares the
two samples (seeds fixed: deterministic). Then a few of the speculating
seeds run again in another batch (with a beam request and a greedy request
beside them): their tokens are the same.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams

VOCAB = 16
NUM_SEEDS = 300
MAX_TOKENS = 4
TEMPERATURE = 0.3
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": None}  # 300 at once


def engine(config_path, speculative) -> Engine:
    return Engine(EngineConfig(model=str(config_path), block_size=4, num_blocks=2048, max_num_seqs=128,
                               max_num_batched_tokens=1024, async_scheduling=False, speculative_config=speculative))


def params(seed: int | None = None, **kw) -> SamplingParams:
    kw = dict(temperature=TEMPERATURE, seed=seed, max_tokens=MAX_TOKENS) | kw
    return SamplingParams(ignore_eos=True, detokenize=False, **kw)


def drain(e: Engine) -> dict[str, list[list[int]]]:
    finals = {}
    while e.has_unfinished_requests():
        finals.update({o.request_id: [c.token_ids for c in o.outputs] for o in e.step() if o.finished})
        e.kv.check_invariants()
    assert e.kv.stats.num_free_blocks == e.num_blocks
    return finals


def sample(e: Engine, prompt: list[int], seeds: range) -> np.ndarray:
    for seed in seeds:
        e.add_request(f"s{seed}", prompt, params(seed))
    finals = drain(e)
    return np.array([finals[f"s{seed}"][0] for seed in seeds])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    config = json.loads(open("configs/tiny.json").read())
    config.update(name="tiny-vocab16", vocab_size=VOCAB, bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1)
    path = tmp_path_factory.mktemp("model") / "tiny16.json"
    path.write_text(json.dumps(config))
    plain = engine(path, None)
    start = [1, 2, 3, 4, 5, 6, 7]
    plain.add_request("g", start, params(temperature=0.0, max_tokens=30))
    prompt = start + drain(plain)["g"][0]
    spec = engine(path, SPECULATIVE)
    return plain, spec, prompt, sample(plain, prompt, range(NUM_SEEDS, 2 * NUM_SEEDS)), \
        sample(spec, prompt, range(NUM_SEEDS))


def test_sampled_requests_speculate_and_some_drafts_are_rejected(setup):
    _, spec, _, _, _ = setup
    stats = spec.stats
    assert stats.spec_num_drafts >= NUM_SEEDS  # one verify step per sequence at least (then some back off)
    assert 0.1 * stats.spec_num_draft_tokens < stats.spec_num_accepted_tokens < 0.9 * stats.spec_num_draft_tokens


def test_each_position_has_the_distribution_of_speculation_off(setup):
    _, _, _, off, on = setup
    for position in range(MAX_TOKENS):
        counts = np.stack([np.bincount(off[:, position], minlength=VOCAB),
                           np.bincount(on[:, position], minlength=VOCAB)])
        common = counts.sum(axis=0) >= 10  # rare tokens pooled into one cell (expected counts >= 5)
        table = np.concatenate([counts[:, common], counts[:, ~common].sum(axis=1, keepdims=True)], axis=1)
        table = table[:, table.sum(axis=0) > 0]
        pvalue = chi2_contingency(table).pvalue
        assert pvalue > 1e-3, f"position {position}: off {counts[0]} vs on {counts[1]} (p={pvalue:.2g})"


def test_seeded_tokens_do_not_depend_on_the_batch(setup):
    """The same seeds beside a beam request and a greedy one; those two equal speculation off."""
    plain, spec, prompt, _, on = setup
    seeds = range(6)
    for e in (plain, spec):
        e.add_request("beam", prompt, params(temperature=0.0, beam_width=2))
        e.add_request("greedy", prompt, params(temperature=0.0))
    plain_finals = drain(plain)
    for seed in seeds:
        spec.add_request(f"s{seed}", prompt, params(seed))
    spec_finals = drain(spec)
    np.testing.assert_array_equal([spec_finals[f"s{seed}"][0] for seed in seeds], on[:len(seeds)])
    assert spec_finals["beam"] == plain_finals["beam"] and spec_finals["greedy"] == plain_finals["greedy"]
