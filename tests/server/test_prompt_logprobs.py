"""`echo` and prompt logprobs over HTTP with the official client, against the dense no-cache forward.

One live `jaxpaged serve` for the module, on a random-weight Llama checkpoint with a byte-level BPE
`tokenizer.json` trained here (the tokenizer lm-evaluation-harness's `local-completions` reads). lm-eval
itself as a client runs in tests/pretrained/test_real_model_references.py, on the real model, against
lm-eval's own transformers backend.
"""

import json

import jax
import numpy as np
import openai
import pytest

from jaxpaged.checkpoint import load_model
from jaxpaged.checkpoint.hf import save_hf_checkpoint
from jaxpaged.config import load_config
from jaxpaged.model import init_model
from tests.paged_driver import dense_logits
from tests.server.live_server import ROOT, serving

tokenizers = pytest.importorskip("tokenizers")

NAME = "tiny-eval"
QUESTIONS = [
    {"question": "The sky is", "choices": [" blue", " green", " loud"], "answer": 0},
    {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
    {"question": "Cats say", "choices": [" meow", " woof", " moo"], "answer": 0},
]
GEN = [{"question": "Hello world, the quick", "answer": " brown"}, {"question": "the sky", "answer": " is"}]
TRAINING_TEXT = [q["question"] + c for q in QUESTIONS for c in q["choices"]] + [g["question"] for g in GEN]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    path = tmp_path_factory.mktemp("eval") / "model"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TRAINING_TEXT, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    config = load_config("tiny").replace(vocab_size=tok.get_vocab_size(), bos_token_id=0, eos_token_id=1)
    model = init_model(config, seed=3)
    save_hf_checkpoint(model, path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         # a real checkpoint without a template is refused for chat: this one ships its own
         "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"}))
    return path, tok


@pytest.fixture(scope="module")
def server(checkpoint):
    # 16-token steps: the prompts are prefilled in several chunks
    yield from serving(f"--model={checkpoint[0]}", f"--served_model_name={NAME}", "--kv_budget_tokens=2048",
                       "--max_model_len=256", "--block_size=4", "--max_num_batched_tokens=16")


@pytest.fixture(scope="module")
def dense_model(checkpoint):
    return load_model(str(checkpoint[0]))


@pytest.fixture(scope="module")
def reference(dense_model):
    """log p(token i | tokens before it) from the dense no-cache forward of the same weights."""
    model = dense_model

    def logprobs(ids: list[int]) -> np.ndarray:
        lp = np.asarray(jax.nn.log_softmax(dense_logits(model, ids), axis=-1))
        return np.array([lp[i - 1, ids[i]] for i in range(1, len(ids))])
    return logprobs


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


def test_echo_with_max_tokens_zero_returns_the_prompt_and_its_logprobs(client, checkpoint, reference):
    prompt = "Hello world, the quick brown fox"  # 32 chars, more tokens than one 16-token chunk holds
    ids = checkpoint[1].encode(prompt).ids
    for attempt in range(2):  # the second one would hit the prefix cache: prompt logprobs skip it
        out = client.completions.create(model=NAME, prompt=prompt, echo=True, logprobs=2, max_tokens=0)
        choice = out.choices[0]
        assert choice.text == prompt
        lp = choice.logprobs
        assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == prompt
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        np.testing.assert_allclose(lp.token_logprobs[1:], reference(ids), atol=2e-4)
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        assert all(len(top) >= 2 for top in lp.top_logprobs[1:])
        assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens_details.cached_tokens == 0


def test_echo_with_generation_appends_the_generated_tokens(client, checkpoint, reference):
    prompt = "the sky"
    ids = checkpoint[1].encode(prompt).ids
    choices = [client.completions.create(model=NAME, prompt=p, echo=True, logprobs=1, max_tokens=3, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0] for p in (prompt, ids)]
    for choice in choices:  # text and token-id prompts alike
        lp = choice.logprobs
        assert choice.text.startswith(prompt) and len(lp.tokens) == len(ids) + 3
        np.testing.assert_allclose(lp.token_logprobs[1:len(ids)], reference(ids), atol=2e-4)
        assert lp.text_offset[len(ids)] == len(prompt)
        assert "".join(lp.tokens) == choice.text
    assert choices[0].text == choices[1].text


def test_vllm_prompt_logprobs_field_in_completions_and_chat(client, checkpoint, reference):
    prompt = "the sky"
    ids = checkpoint[1].encode(prompt).ids
    out = client.completions.create(model=NAME, prompt=prompt, max_tokens=1, extra_body={"prompt_logprobs": 2})
    entries = out.choices[0].prompt_logprobs
    assert entries[0] is None and len(entries) == len(ids)
    np.testing.assert_allclose([entries[i][str(ids[i])]["logprob"] for i in range(1, len(ids))], reference(ids),
                               atol=2e-4)
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    assert chat.choices[0].prompt_logprobs[0] is None and len(chat.choices[0].prompt_logprobs) > 1


def test_unimplemented_sampling_fields_are_refused(client):
    for body in ({"best_of": 3}, {"suffix": "and then"}):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=NAME, prompt="the sky", max_tokens=2, extra_body=body)
        assert next(iter(body)) in err.value.message


def test_streamed_echo_equals_the_non_streamed_one(client):
    kwargs = dict(model=NAME, prompt="the sky", echo=True, logprobs=1, max_tokens=3, temperature=0,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kwargs) if c.choices]
    assert "".join(c.text for c in chunks) == full.text
    streamed = [lp for c in chunks if c.logprobs for lp in c.logprobs.token_logprobs]
    assert streamed == full.logprobs.token_logprobs
