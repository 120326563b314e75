"""Admission refuses only what can never fit (tested at the boundary), and `LLM.generate` returns exactly its own outputs."""

import pytest

from jaxpaged import LLM, SamplingParams
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.engine.input_processor import max_blocks_needed

BLOCK, POOL = 4, 16


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(EngineConfig(model="tiny", block_size=BLOCK, num_blocks=POOL, max_num_seqs=8), model=tiny_model)


def _drain(engine):
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
    return outs


def _params(max_tokens, **kw):
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=3, **kw)


def test_n1_prompt_plus_max_tokens_equal_to_the_pool_fits(engine):
    assert engine.max_model_len == POOL * BLOCK
    engine.add_request("full", list(range(1, 50)), _params(POOL * BLOCK - 49))
    out = _drain(engine)["full"]
    assert len(out.outputs[0].token_ids) == POOL * BLOCK - 49
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        engine.add_request("over", list(range(1, 50)), _params(POOL * BLOCK - 48))


def test_issue_example_fits_its_bound():
    """1,000 prompt tokens + 24 on 64 blocks of 16 (max_model_len 1024) was refused as "can never fit"."""
    assert max_blocks_needed(1000, SamplingParams(max_tokens=24), max_model_len=1024, block_size=16) == 64


@pytest.mark.parametrize("kw", [dict(n=2, temperature=1.0), dict(n=3, temperature=0.7), dict(beam_width=2)])
def test_parallel_and_beam_requests_fit_exactly_at_the_bound(engine, kw):
    """The largest max_tokens whose bound is the pool runs to completion within the pool; one more is refused."""
    prompt = list(range(7, 16))
    fits = max(m for m in range(1, 56) if max_blocks_needed(len(prompt), _params(m, **kw), max_model_len=64,
                                                           block_size=BLOCK) <= POOL)
    engine.add_request("edge", prompt, _params(fits, **kw))
    out = _drain(engine)["edge"]
    width = kw.get("n", kw.get("beam_width"))
    assert len(out.outputs) == width and out.finished
    if "n" in kw:  # sampled: every output runs its full length
        assert all(len(o.token_ids) == fits for o in out.outputs)
    assert engine.kv.stats.num_used_blocks == 0
    with pytest.raises(ValueError, match="can never fit"):
        engine.add_request("over", prompt, _params(fits + 1, **kw))


def test_bound_counts_shared_prompt_blocks_once():
    n4 = max_blocks_needed(9, SamplingParams(n=4, max_tokens=3), max_model_len=64, block_size=4)
    assert n4 == 2 + 4 * (3 - 2)  # 2 shared full prompt blocks, each sample owns blocks 2..cdiv(11, 4)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", num_blocks=64, block_size=8, seed=0)


PROMPTS = [[72, 105], [1, 2, 3], [9, 8, 7, 6]]
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


def test_llm_generate_returns_its_own_outputs_in_order_whatever_else_the_engine_holds(llm):
    expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    nxt = llm._next_id
    # a request added directly under the id generate would pick next, one aborted, one long one
    llm.engine.add_request(f"llm-{nxt}", [5, 6], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    llm.engine.add_request("aborted", [5, 6, 7], GREEDY)
    llm.engine.abort("aborted")
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert [o.prompt_token_ids for o in outs] == PROMPTS
    assert f"llm-{nxt}" not in [o.request_id for o in outs]
    assert llm.engine.has_request(f"llm-{nxt}")  # untouched, still running
    _drain(llm.engine)


def test_llm_generate_after_an_interrupted_call(llm):
    expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    real_step = llm.engine.step

    def interrupted():
        real_step()
        raise KeyboardInterrupt

    llm.engine.step = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS[::-1], GREEDY, use_tqdm=False)
    del llm.engine.step
    assert llm.engine.has_unfinished_requests()  # the interrupted call's requests are still there
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    _drain(llm.engine)
