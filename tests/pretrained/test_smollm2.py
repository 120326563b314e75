"""The pretrained SmolLM2-135M-Instruct GGUF (`make model`) against transformers' own GGUF loader on the same file.

The tokenizer built from the metadata against transformers' GGUF tokenizer. In float32: per-token
logprobs of a real passage (643 tokens, tests/pretrained/passage.txt, written for this project) within
1e-4; greedy chat answers token for token, through the engine under block sizes 32 and 16, prefix caching
on and off, chunked prefill and preemption, and through a live `jaxpaged serve` with the official `openai`
client, streamed and not. transformers' `generate` always gets an explicit attention mask: SmolLM2's pad
token is `<|im_end|>`, the chat template's turn separator, and without a mask it is masked out of the prompt.

Cost: the weights load once for the in-process engines, once in the server (tests/pretrained/conftest.py,
shared with the other pretrained module). The server has the first engine's geometry, so its steps come
from the persistent compile cache that engine filled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jaxpaged.pretrained import default_model_path

MODEL = default_model_path()
PASSAGE = (Path(__file__).parent / "passage.txt").read_text()
SYSTEM = ("You are a concise assistant for a quiz show. Answer every question with one short, plain sentence, "
          "and do not add any explanation, greeting or follow-up question.")  # 42 tokens before the question
QUESTIONS = ["What is the capital of France?", "What is the capital of the United States?",
             "How many legs does a spider have?", "What color is the sky on a clear day?",
             "Name a planet in our solar system.", "What do bees make?"]
MAX_TOKENS = 20
# Each must give transformers' tokens. The first also runs the passage and is the server's geometry.
CACHING_CHUNKED = dict(block_size=32, num_blocks=64, max_model_len=1024, enable_prefix_caching=True,
                       max_num_batched_tokens=64)
ENGINE_VARIANTS = {
    "block32-prefix-caching-chunked-prefill": CACHING_CHUNKED,
    # prompts of 55 and 37 tokens fill the 7 blocks two at a time: a running answer crossing a block preempts
    "block16-no-caching-preemption": dict(block_size=16, num_blocks=7, max_model_len=112,
                                          enable_prefix_caching=False, max_num_batched_tokens=128),
}
def _messages(question: str, index: int) -> list[dict[str, str]]:
    """Half the conversations share a system prompt (prefix hits); the others get the template's default."""
    system = [{"role": "system", "content": SYSTEM}] if index % 2 == 0 else []
    return system + [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def server(smollm2_server):
    return smollm2_server


@pytest.fixture(scope="module")
def hf_model(hf_smollm2):
    return hf_smollm2


@pytest.fixture(scope="module")
def jax_model():
    from jaxpaged.checkpoint import load_model
    return load_model(MODEL, dtype="float32")


@pytest.fixture(scope="module")
def tokenizer():
    from jaxpaged.checkpoint import model_config
    from jaxpaged.tokenizer import load_tokenizer
    return load_tokenizer(MODEL, model_config(MODEL))


@pytest.fixture(scope="module")
def chat_ids(tokenizer) -> list[list[int]]:
    from jaxpaged.server.chat import ChatTemplate
    template = ChatTemplate.for_model(str(MODEL))
    return [tokenizer.encode(template.render(_messages(q, i)), add_special_tokens=False)
            for i, q in enumerate(QUESTIONS)]


@pytest.fixture(scope="module")
def hf_answers(hf_model, chat_ids, tokenizer) -> list[list[int]]:
    """transformers' greedy tokens for each chat prompt, up to and without the stop token: one left-padded
    batch, the padding masked by the explicit attention mask (and only the padding)."""
    import torch

    width = max(len(ids) for ids in chat_ids)
    pad = tokenizer.eos_token_id
    prompts = torch.tensor([[pad] * (width - len(ids)) + ids for ids in chat_ids])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chat_ids])
    with torch.no_grad():
        out = hf_model.generate(prompts, attention_mask=mask, max_new_tokens=MAX_TOKENS, do_sample=False,
                                pad_token_id=pad, eos_token_id=sorted(tokenizer.stop_token_ids))
    return [_until_stop(row[width:].tolist(), tokenizer) for row in out]


def _until_stop(tokens: list[int], tokenizer) -> list[int]:
    for i, token in enumerate(tokens):
        if token in tokenizer.stop_token_ids:
            return tokens[:i]
    return tokens


def _run(engine, prompts, params, name: str = "r") -> list:
    """Every prompt to completion on `engine`; outputs in prompt order."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{name}{i}", prompt, params)
    done = {}
    while engine.has_unfinished_requests():
        done |= {out.request_id: out for out in engine.step() if out.finished}
    return [done[f"{name}{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def engine_of(jax_model):
    """`engine_of(variant)`: its engine, built once per module (the next test reuses its compiled steps)."""
    from jaxpaged.engine import Engine, EngineConfig

    built = {}

    def get(variant: str):
        if variant not in built:
            built[variant] = Engine(EngineConfig(model=str(MODEL), **ENGINE_VARIANTS[variant]), model=jax_model)
        return built[variant]

    yield get
    built.clear()


def test_the_gguf_reads_as_transformers_reads_it(jax_model, hf_model):
    config = jax_model.config
    assert (config.model_type, config.num_layers, config.num_heads, config.num_kv_heads, config.vocab_size,
            config.tie_embeddings) == ("llama", 30, 9, 3, 49152, True)
    assert config.rope_theta == hf_model.config.rope_parameters["rope_theta"]


def test_tokenizer_built_from_metadata_equals_transformers(tokenizer, hf_smollm2_tokenizer):
    """The same ids as transformers' GGUF tokenizer, and the same text back (digits split one by one, specials
    whole, multi-byte characters)."""
    reference = hf_smollm2_tokenizer
    texts = [PASSAGE, "It's 2024: 12345 apples cost $3.50!", "  two  spaces\n\n\ttab é ü 中文 🙂",
             "<|im_start|>user\nhi<|im_end|>\n"]
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids == reference(text)["input_ids"], text
        assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.stop_token_ids) == (1, 2, {2})


def test_passage_logprobs_equal_transformers(engine_of, hf_model, tokenizer):
    import torch

    from jaxpaged.outputs import RequestOutputKind
    from jaxpaged.sampling_params import SamplingParams

    ids = tokenizer.encode(PASSAGE)
    assert len(ids) >= 512
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits[0]
    expected = torch.log_softmax(logits.double(), -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    engine = engine_of("block32-prefix-caching-chunked-prefill")
    out, = _run(engine, [ids], SamplingParams(max_tokens=1, prompt_logprobs=0,
                                             output_kind=RequestOutputKind.FINAL_ONLY))
    got = np.array([entry[token] for entry, token in zip(out.prompt_logprobs[1:], ids[1:])])
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    assert engine.kv.stats.usage == 0


@pytest.mark.parametrize("variant", list(ENGINE_VARIANTS))
def test_greedy_chat_answers_equal_transformers(engine_of, chat_ids, hf_answers, tokenizer, variant):
    from jaxpaged.outputs import RequestOutputKind
    from jaxpaged.sampling_params import SamplingParams

    engine = engine_of(variant)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, output_kind=RequestOutputKind.FINAL_ONLY)
    # the first conversation alone, then the rest: those sharing its system prompt can hit its cached block
    outs = _run(engine, chat_ids[:1], params, "first") + _run(engine, chat_ids[1:], params, "rest")
    got = [_until_stop(list(o.outputs[0].token_ids), tokenizer) for o in outs]
    assert got == hf_answers
    assert "Paris" in tokenizer.decode(got[0])
    if engine.config.enable_prefix_caching:
        assert engine.kv_stats().prefix_hits_tokens > 0
    else:
        assert engine.num_preemptions > 0
    assert engine.kv.stats.usage == 0


def test_greedy_chat_answers_with_ngram_speculation_equal_speculation_off(jax_model, chat_ids, hf_answers,
                                                                         tokenizer):
    """n-gram speculation (k = 4, the default disable_by_batch_size, overlapped steps) on the loaded model, one
    conversation at a time (a batch of one speculates; one verify shape, few compiles): the answers are
    transformers' greedy ones, which the engine gives with speculation off (above)."""
    from jaxpaged.engine import Engine, EngineConfig
    from jaxpaged.outputs import RequestOutputKind
    from jaxpaged.sampling_params import SamplingParams

    engine = Engine(EngineConfig(model=str(MODEL), **CACHING_CHUNKED, speculative_config={"method": "ngram"}),
                    model=jax_model)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, output_kind=RequestOutputKind.FINAL_ONLY)
    outs = [_run(engine, [ids], params, f"spec{i}-")[0] for i, ids in enumerate(chat_ids)]
    assert [_until_stop(list(o.outputs[0].token_ids), tokenizer) for o in outs] == hf_answers
    stats = engine.stats  # drafts both accepted and rejected (slots released)
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    assert engine.kv_stats().prefix_hits_tokens > 0 and engine.kv.stats.usage == 0


def test_server_chat_answers_equal_transformers(server, hf_answers, tokenizer):
    """Every conversation at once through the official client, every other one streamed."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=600)

    def ask(job: tuple[int, bool]) -> str:
        index, stream = job
        request = dict(model="smollm2", messages=_messages(QUESTIONS[index], index), max_tokens=MAX_TOKENS,
                       temperature=0)
        if not stream:
            return client.chat.completions.create(**request).choices[0].message.content
        return "".join(chunk.choices[0].delta.content or ""
                       for chunk in client.chat.completions.create(**request, stream=True) if chunk.choices)

    jobs = [(i, i % 2 == 1) for i in range(len(QUESTIONS))]
    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(ask, jobs))
    expected = [tokenizer.decode(hf_answers[i]) for i, _ in jobs]
    assert texts == expected


EXTRACTION_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                     "required": ["name", "age"], "additionalProperties": False}
PEOPLE = [("Alice", 30, "Alice is 30 years old and lives in Lyon."),
          ("Bob", 45, "My neighbour Bob turned 45 last week."),
          ("Maria", 22, "Maria, aged 22, studies chemistry."),
          ("Tom", 67, "Tom is a 67 year old retired teacher.")]


def test_structured_extraction_is_valid_and_sensible(engine_of, tokenizer):
    """A JSON-schema constraint on the real model: every answer validates, and the model names the sentence's
    person (the grammar bounds the form, the model supplies the content). Ages are only schema-checked: the
    135M model copies one sentence's age into the next ones (Bob 22, Tom 22)."""
    import json

    import jsonschema

    from jaxpaged.outputs import RequestOutputKind
    from jaxpaged.sampling_params import SamplingParams
    from jaxpaged.server.chat import ChatTemplate
    from jaxpaged.structured.params import StructuredOutputsParams

    template = ChatTemplate.for_model(str(MODEL))
    prompts = [tokenizer.encode(template.render([{"role": "user", "content":
                                                  f"Extract the person's name and age as JSON.\n{sentence}"}]),
                                add_special_tokens=False) for _, _, sentence in PEOPLE]
    params = SamplingParams(temperature=0, max_tokens=40, output_kind=RequestOutputKind.FINAL_ONLY,
                            structured_outputs=StructuredOutputsParams(json=EXTRACTION_SCHEMA,
                                                                       disable_any_whitespace=True))
    engine = engine_of("block32-prefix-caching-chunked-prefill")
    outs = _run(engine, prompts, params, "extract")
    answers = [json.loads(tokenizer.decode(_until_stop(list(o.outputs[0].token_ids), tokenizer))) for o in outs]
    for answer in answers:
        jsonschema.validate(answer, EXTRACTION_SCHEMA)
    assert [a["name"] for a in answers] == [name for name, _, _ in PEOPLE]
    assert answers[0]["age"] == PEOPLE[0][1]
    assert engine.kv.stats.usage == 0
