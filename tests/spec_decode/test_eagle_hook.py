"""The hidden-state hook, with a random EAGLE-style head: plumbing and exactness only.

Every time the head is asked for drafts, the hidden state it gets for each
sequence of n tokens must be the target's last-layer hidden state (after the
final norm) at position n - 2, recomputed here densely with no cache; and
greedy outputs must equal speculation off. The batch has a prefix hit, a
prompt chunked over several steps and plain decodes beside the verify spans.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.spec_decode.eagle import EagleHead, EagleHeadProposer

K = 3
_rng = np.random.default_rng(3)
_SHARED = _rng.integers(3, 250, 16).tolist()
PROMPTS = [_SHARED + _rng.integers(3, 250, 5).tolist(), _SHARED + _rng.integers(3, 250, 3).tolist(),
           _rng.integers(3, 250, 40).tolist()]  # two share a prefix; the last is chunked


class RecordingHead(EagleHeadProposer):
    """Keeps what each call got: the sequences' tokens and the hidden states."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = []

    def propose(self, token_ids, max_drafts, context=None):
        self.calls.append(([list(t) for t in token_ids], np.array(context.hidden_states)))
        return super().propose(token_ids, max_drafts, context)


def dense_hidden(model, tokens: list[int]) -> np.ndarray:
    """The target's last-layer hidden states after the final norm, no cache: `[len(tokens), H]`."""
    x = model.embed_tokens(jnp.asarray([tokens]))
    positions = jnp.arange(len(tokens))[None]
    for layer in model.layers:
        x = layer.dense(x, positions, model.inv_freq[...])
    return np.asarray(model.norm(x)[0])


def run(model, proposer=None) -> tuple[Engine, dict[str, list[int]]]:
    spec = {"method": "ngram", "num_speculative_tokens": K, "disable_by_batch_size": None} if proposer else None
    engine = Engine(EngineConfig(model="tiny", block_size=8, num_blocks=48, max_num_seqs=4, max_num_batched_tokens=24,
                                 async_scheduling=False, speculative_config=spec), model, proposer=proposer)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=12 + 2 * i, ignore_eos=True))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
        engine.kv.check_invariants()
    assert engine.kv.stats.num_free_blocks == engine.num_blocks
    return engine, finals


def test_the_head_gets_the_targets_hidden_state_before_the_last_token_and_changes_no_token():
    config = load_config("tiny")
    target = init_model(config, seed=0)
    head = RecordingHead(EagleHead(config, rngs=nnx.Rngs(7)), target, K)
    _, want = run(target)
    engine, got = run(target, head)
    assert got == want
    assert engine.stats.spec_num_draft_tokens > 0 and len(head.calls) > 1
    # causal: a sequence's hidden states at call time are those of its final tokens at the same positions
    finals = [engine_prompt + got[f"r{i}"] for i, engine_prompt in enumerate(PROMPTS)]
    reference = [dense_hidden(target, tokens) for tokens in finals]
    compared = 0
    for token_ids, hidden in head.calls:
        assert hidden.shape == (len(token_ids), config.hidden_size)
        for tokens, h in zip(token_ids, hidden):
            (which,) = [j for j, final in enumerate(finals) if final[:len(tokens)] == tokens]
            np.testing.assert_allclose(h, reference[which][len(tokens) - 2], rtol=1e-4, atol=1e-4)
            compared += 1
    assert compared > len(head.calls)  # several sequences per call: rows were not mixed up
