"""What the pretrained-model modules share: one live server and one transformers model per test process.

Both modules compare the same GGUF file with transformers; when xdist gives them the same worker they reuse
one `jaxpaged serve` (one weight load, one set of compiles) and one transformers load.
"""

from __future__ import annotations

import pytest

from jaxpaged.pretrained import default_model_path
from tests.server.live_server import serving

MODEL = default_model_path()
SERVED_NAME = "smollm2"
# float32 so tokens and logprobs compare with transformers'; block 32 with chunked prefill and prefix caching
SERVER_FLAGS = ["--block_size=32", "--kv_budget_tokens=2048", "--max_model_len=1024", "--enable_prefix_caching",
                "--max_num_batched_tokens=64", "--dtype=float32"]

if not MODEL.is_file():
    pytest.fail(f"{MODEL} is missing: run `make model` (python -m jaxpaged.pretrained)", pytrace=False)


@pytest.fixture(scope="session")
def smollm2_server():
    """`jaxpaged serve` on the pretrained GGUF (SERVER_FLAGS); its base URL."""
    yield from serving(f"--model={MODEL}", f"--served_model_name={SERVED_NAME}", *SERVER_FLAGS)


@pytest.fixture(scope="session")
def hf_smollm2():
    """transformers' model from the same GGUF, on one torch thread: beside XLA's threads on a busy 2-core
    machine, two torch threads made the chat generation 8x slower (47 s vs 6 s)."""
    import torch
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield AutoModelForCausalLM.from_pretrained(MODEL.parent, gguf_file=MODEL.name, dtype=torch.float32).eval()
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer():
    """transformers' tokenizer built from the same GGUF's metadata (its own converter)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL.parent, gguf_file=MODEL.name)
