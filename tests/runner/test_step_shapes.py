"""How many step shapes an engine compiles: the count the runner reports against a plain model of the padding rule."""

import jax
import numpy as np

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams

BLOCK_SIZE = 4
MIN_DECODE_ROWS = 2 if jax.default_backend() == "cpu" else 1  # a one-row dot is XLA:CPU's slow path


def _pow2(n: int, minimum: int = 1) -> int:
    return 0 if n <= 0 else 1 << (max(n, minimum) - 1).bit_length()


def expected_shape(num_tokens: list[int], starts: list[int], block_size: int, *, merged: bool = True) -> tuple:
    """(tokens, rows, blocks per row, decode rows, prefill chunk) of one step, from its schedule.

    The rule as documented: powers of two; prefill tokens and chunk at least 16,
    blocks per row at least 4, and with `merged` (this version) at least 32 in a
    step of decodes only; decode rows at least 2 on CPU.
    """
    prefill = [n for n in num_tokens if n > 1]
    num_decodes = len(num_tokens) - len(prefill)
    prefill_tokens = _pow2(sum(prefill), 16)
    decode_rows = _pow2(num_decodes, MIN_DECODE_ROWS)
    max_blocks = max(-(-(s + n) // block_size) for s, n in zip(starts, num_tokens))
    chunk = min(_pow2(max(prefill, default=0), 16), prefill_tokens)
    return (decode_rows + prefill_tokens, decode_rows + _pow2(len(prefill)),
            _pow2(max_blocks, 32 if merged and not prefill else 4), decode_rows, chunk)


def _shape(step) -> tuple:
    return (step.token_ids.shape[0], step.block_tables.shape[0], step.block_tables.shape[1],
            step.layout.num_decode_seqs, step.layout.max_prefill_query_len)


def test_compiled_step_shapes_match_the_padding_rule(tiny_model):
    """A first batch (a chunked prefill next to decodes, requests ending at different lengths, decodes
    whose context grows past 64 tokens) compiles exactly the distinct shapes the rule gives its schedule, fewer than
    plain powers of two would."""
    engine = Engine(EngineConfig(model="tiny", num_blocks=256, block_size=BLOCK_SIZE, max_num_batched_tokens=64, max_num_seqs=2),
                    model=tiny_model)
    runner, seen = engine.runner, []
    prepare = runner.prepare_step

    def recording_prepare(out):
        step = prepare(out)
        if step is not None:
            seen.append((expected_shape(out.num_tokens, out.starts, BLOCK_SIZE),
                         expected_shape(out.num_tokens, out.starts, BLOCK_SIZE, merged=False), _shape(step)))
        return step

    runner.prepare_step = recording_prepare
    rng = np.random.default_rng(0)
    for i, (length, max_tokens) in enumerate([(50, 24), (9, 3), (30, 2)]):
        engine.add_request(str(i), rng.integers(0, 250, length).tolist(),
                           SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()

    assert [shape for _, _, shape in seen] == [want for want, _, _ in seen]
    merged = {want for want, _, _ in seen}
    before = {old for _, old, _ in seen}
    assert runner.num_compiles == len(merged)
    assert len(merged) < len(before)
