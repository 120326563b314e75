"""Online-benchmark request sets: random, prefix repetition, ShareGPT JSON, workloads, prompt formats."""

import json
from collections import Counter

import pytest

from jaxpaged.bench.online.datasets import (BenchRequest, from_workload, load_bench_tokenizer, prefix_repetition_requests,
                                     random_requests, sharegpt_requests, with_prompt_format)
from jaxpaged.sim.workloads import TOKEN_ID_LIMIT, make_workload
from jaxpaged.tokenizer import ByteTokenizer


def test_random_requests_lengths_tokens_and_seed():
    reqs = random_requests(200, input_len=40, output_len=10, range_ratio=0.5, seed=1)
    assert len({r.request_id for r in reqs}) == 200
    assert all(20 <= r.prompt_len <= 60 and len(r.prompt) == r.prompt_len for r in reqs)
    assert all(5 <= r.output_len <= 15 for r in reqs)
    assert min(r.prompt_len for r in reqs) < 30 and max(r.prompt_len for r in reqs) > 50  # the range is used
    assert all(0 <= t < TOKEN_ID_LIMIT for r in reqs for t in r.prompt)
    assert reqs == random_requests(200, input_len=40, output_len=10, range_ratio=0.5, seed=1)
    assert reqs != random_requests(200, input_len=40, output_len=10, range_ratio=0.5, seed=2)
    fixed = random_requests(5, input_len=8, output_len=3)
    assert all(r.prompt_len == 8 and r.output_len == 3 for r in fixed)


@pytest.mark.parametrize("kwargs, match", [({"input_len": 0, "output_len": 1}, "input_len"),
                                           ({"input_len": 4, "output_len": 4, "range_ratio": 1.0}, "range_ratio")])
def test_random_requests_reject_bad_lengths(kwargs, match):
    with pytest.raises(ValueError, match=match):
        random_requests(2, **kwargs)


def test_prefix_repetition_shares_prefixes_evenly_with_unique_suffixes():
    reqs = prefix_repetition_requests(12, prefix_len=16, suffix_len=8, num_prefixes=3, output_len=5, seed=0)
    assert all(r.prompt_len == len(r.prompt) == 24 and r.output_len == 5 for r in reqs)
    prefixes = Counter(tuple(r.prompt[:16]) for r in reqs)
    assert sorted(prefixes.values()) == [4, 4, 4]
    assert len({tuple(r.prompt[16:]) for r in reqs}) == 12
    # shuffled: the prefixes do not simply cycle in order
    order = [list(prefixes).index(tuple(r.prompt[:16])) for r in reqs]
    assert order != [i % 3 for i in range(12)]
    with pytest.raises(ValueError, match="num_prefixes"):
        prefix_repetition_requests(4, prefix_len=4, suffix_len=4, num_prefixes=0, output_len=1)


def conversation(prompt, reply):
    return {"id": "x", "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}


def test_sharegpt_text_and_token_prompts_filtered_like_vllm(tmp_path):
    data = [conversation("hello world", "a reply of some length"),     # 11 / 22 bytes: kept
            conversation("hi", "a long enough reply"),                  # prompt under 4 tokens: dropped
            conversation("long enough prompt", "no"),                   # reply under 4 tokens: dropped
            {"id": "single", "conversations": [{"from": "human", "value": "only one turn"}]},  # dropped
            conversation(list(range(10)), list(range(6))),              # token ids: kept
            conversation("y" * 50, "z" * 10)]                           # prompt over max_prompt_len=40: dropped
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    reqs = sharegpt_requests(path, 2, tokenizer=ByteTokenizer(), max_prompt_len=40)
    by_prompt = {json.dumps(r.prompt): r for r in reqs}
    assert set(by_prompt) == {json.dumps("hello world"), json.dumps(list(range(10)))}
    assert (by_prompt['"hello world"'].prompt_len, by_prompt['"hello world"'].output_len) == (11, 22)
    assert (by_prompt[json.dumps(list(range(10)))].prompt_len, by_prompt[json.dumps(list(range(10)))].output_len) == (10, 6)
    fixed = sharegpt_requests(path, 2, tokenizer=ByteTokenizer(), max_prompt_len=40, output_len=3)
    assert all(r.output_len == 3 for r in fixed)  # a fixed output length also keeps the "no" reply's prompt
    assert len(sharegpt_requests(path, 3, tokenizer=ByteTokenizer(), max_prompt_len=40, output_len=3)) == 3
    with pytest.raises(ValueError, match="only 2 usable conversations for 3"):
        sharegpt_requests(path, 3, tokenizer=ByteTokenizer(), max_prompt_len=40)
    with pytest.raises(ValueError, match=r"prompt \+ output <= 20"):
        sharegpt_requests(path, 2, tokenizer=ByteTokenizer(), max_total_len=20)
    with pytest.raises(ValueError, match="tokenizer is needed"):
        sharegpt_requests(path, 1, tokenizer=None)


def test_sharegpt_rejects_a_file_that_is_not_a_list(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"conversations": []}))
    with pytest.raises(ValueError, match="JSON list"):
        sharegpt_requests(path, 1, tokenizer=ByteTokenizer())


def test_from_workload_keeps_prompts_lengths_and_salts():
    workload = make_workload("multitenant", num_requests=4, num_tenants=2, system_len=8, user_len=4, output_len=3)
    reqs = from_workload(workload)
    assert [(r.request_id, r.prompt, r.output_len, r.cache_salt) for r in reqs] == [
        (w.request_id, w.prompt_token_ids, w.max_tokens, w.cache_salt) for w in workload]
    assert all(r.prompt_len == len(r.prompt) for r in reqs)
    with pytest.raises(ValueError, match="multiturn"):
        from_workload(make_workload("multiturn", num_requests=4))


def test_prompt_format_conversion_remeasures_lengths():
    tok = ByteTokenizer()
    reqs = [BenchRequest("a", [104, 105], 2, 1), BenchRequest("b", "héllo", 6, 1)]
    as_text = with_prompt_format(reqs, "text", tok)
    assert [(r.prompt, r.prompt_len) for r in as_text] == [("hi", 2), ("héllo", 6)]
    as_ids = with_prompt_format(reqs, "tokens", tok)
    assert [(r.prompt, r.prompt_len) for r in as_ids] == [([104, 105], 2), (list("héllo".encode()), 6)]
    # random bytes are not valid UTF-8: the text re-encodes to a different length, which is what counts
    lone = with_prompt_format([BenchRequest("c", [0xC3], 1, 1)], "text", tok)[0]
    assert lone.prompt == "\ufffd" and lone.prompt_len == 3
    with pytest.raises(ValueError, match="prompt_format"):
        with_prompt_format(reqs, "bytes", tok)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        with_prompt_format(reqs, "text", None)


def test_load_bench_tokenizer(tmp_path):
    from jaxpaged.checkpoint.hf import save_hf_checkpoint
    from jaxpaged.config import load_config
    from jaxpaged.model import init_model
    assert isinstance(load_bench_tokenizer("tiny"), ByteTokenizer)
    save_hf_checkpoint(init_model(load_config("tiny"), seed=0), tmp_path)
    assert isinstance(load_bench_tokenizer(str(tmp_path)), ByteTokenizer)  # a checkpoint without tokenizer.json
    with pytest.raises(ValueError, match="unknown model config"):
        load_bench_tokenizer("no-such-model")
