"""A Qwen3 checkpoint directory (weights, tokenizer.json, ChatML template) served through the chat endpoint.

The server loads the directory as a user's `--model=` would; its reply must be
what `LLM.generate` gives in this process on the prompt the directory's own
template renders (not the default template). The directory's tokenizer adds a
BOS to every text and its template writes one too (as Llama 3's and Gemma's
do): a chat prompt must carry it once, as vLLM encodes chat prompts without
the tokenizer's special tokens.
"""

import openai
import pytest

from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.checkpoint import save_hf_checkpoint
from jaxpaged.config import load_config
from jaxpaged.llm import LLM
from jaxpaged.model import init_model
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.chat import ChatTemplate
from tests.model.hf_families import write_chatml_tokenizer

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is paging?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3-chat"
    save_hf_checkpoint(init_model(load_config("tiny-qwen3"), seed=2), path)
    write_chatml_tokenizer(path, bos=True)
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    with ServerProcess([f"--model={checkpoint}", "--kv_budget_tokens=1024", "--max_model_len=256"]) as proc:
        yield proc.base_url


def test_chat_reply_uses_the_directory_template_and_matches_llm(checkpoint, server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(model=str(checkpoint), messages=MESSAGES, max_tokens=8,
                                           temperature=0, extra_body={"ignore_eos": True})
    prompt = ChatTemplate.for_model(str(checkpoint)).render(MESSAGES)
    assert prompt.startswith("<s><|im_start|>system\nbe brief<|im_end|>")
    llm = LLM(model=str(checkpoint), num_blocks=64, block_size=16, max_model_len=256)
    assert llm.engine.tokenizer.encode("a")[0] == 258  # the tokenizer adds BOS to a plain text
    prompt_ids = llm.engine.tokenizer.encode(prompt, add_special_tokens=False)
    ref = llm.generate([prompt_ids], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                       use_tqdm=False)[0]
    assert ref.prompt_token_ids[:2] == [258, 256] and ref.prompt_token_ids.count(257) == 2  # one BOS, ChatML
    assert reply.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert reply.choices[0].message.content == ref.outputs[0].text
    assert reply.usage.completion_tokens == 8
