"""Two references on the pretrained SmolLM2 GGUF against one live `jaxpaged serve` (float32) of the same file.

lm-evaluation-harness: the shipped local task (data/eval: multiple choice and `generate_until`) run through
`jaxpaged lm-eval` against the server and through lm-eval's own `hf` backend (transformers' GGUF loader) on the
same file (in this process, on the transformers model the other pretrained module loads) must give the same
per-item loglikelihoods (within 1e-4), the same generations and the same scores.

transformers' attention-mask trap: `generate` without an `attention_mask` masks every `pad_token_id` in the
prompt (when the pad id is not an EOS id), and SmolLM2's pad token is `<|im_end|>`, the chat template's turn
separator. The reference helper here always passes the mask; with it transformers' greedy answer equals the
server's, without it the answer differs.

Cost: the server, the transformers model and its tokenizer are the ones tests/pretrained/conftest.py shares with
the other pretrained module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxpaged.pretrained import default_model_path
from tests.server.live_server import ROOT

pytest.importorskip("lm_eval", reason="the lm-eval extra (pip install -e '.[eval]')")

MODEL = default_model_path()
NAME = "smollm2"  # the shared server's --served_model_name (conftest.py)
TASKS = ["jaxpaged_real_mc", "jaxpaged_real_gen"]
OFFLINE = dict(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
TRAP_QUESTION = "How many legs does a spider have?"


@pytest.fixture(scope="module")
def server(smollm2_server):
    return smollm2_server


def _lm_eval(cmd: list[str], tmp_path, name: str) -> dict[str, list[dict]]:
    """Run an lm-eval command line from the repository root (the task's data paths are relative to it);
    its logged samples by task."""
    out = tmp_path / name
    env = dict(os.environ, HF_DATASETS_CACHE=str(tmp_path / f"datasets-{name}"), **OFFLINE)
    proc = subprocess.run(cmd + ["--output_path", str(out), "--log_samples"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    samples = {}
    for f in out.rglob("samples_*.jsonl"):
        task = next(t for t in TASKS if f.name.startswith(f"samples_{t}_"))
        samples[task] = sorted((json.loads(line) for line in f.read_text().splitlines()), key=lambda s: s["doc_id"])
    assert sorted(samples) == sorted(TASKS), proc.stdout[-3000:]
    return samples


@pytest.fixture(scope="module")
def through_server(server, tmp_path_factory):
    cmd = [sys.executable, "-m", "jaxpaged", "lm-eval", f"--base_url={server}", f"--tokenizer={MODEL}",
           f"--tasks={','.join(TASKS)}", "--include_path=data/eval", "--num_concurrent=1", "--"]
    return _lm_eval(cmd, tmp_path_factory.mktemp("lm_eval"), "server")


@pytest.fixture(scope="module")
def through_hf(hf_smollm2, hf_smollm2_tokenizer, monkeypatch_module):
    """The same tasks through lm-eval's own `hf` backend (`HFLM`) on transformers' model of the same GGUF, in this
    process: the model and tokenizer are the ones the other pretrained module compares with, and the task index
    holds the shipped tasks alone (indexing lm-eval's thousands of built-in tasks costs a minute on 2 cores)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    for key, value in OFFLINE.items():
        monkeypatch_module.setenv(key, value)
    monkeypatch_module.chdir(ROOT)  # the task's data paths are relative to the repository root
    model = HFLM(pretrained=hf_smollm2, tokenizer=hf_smollm2_tokenizer, batch_size=1, device="cpu")
    tasks = TaskManager(include_path=str(ROOT / "data" / "eval"), include_defaults=False)
    samples = lm_eval.simple_evaluate(model=model, tasks=TASKS, task_manager=tasks, log_samples=True)["samples"]
    assert sorted(samples) == sorted(TASKS)
    return {task: sorted(samples[task], key=lambda s: s["doc_id"]) for task in TASKS}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _arguments(sample: dict) -> list[list[str]]:
    """A sample's request arguments as lists of strings, whether logged to a file by lm-eval
    (`{"gen_args_0": {"arg_0": ...}}`) or returned in memory (a list of tuples)."""
    args = sample["arguments"]
    if isinstance(args, dict):
        return [[str(v) for v in args[k].values()] for k in sorted(args, key=lambda k: int(k.split("_")[-1]))]
    return [[str(v) for v in arg] for arg in args]


def test_multiple_choice_loglikelihoods_and_accuracy_equal_the_hf_backend(through_server, through_hf):
    ours, theirs = through_server["jaxpaged_real_mc"], through_hf["jaxpaged_real_mc"]
    assert len(ours) == len(theirs) == 8
    for a, b in zip(ours, theirs):
        assert _arguments(a) == _arguments(b)
        got = [float(r[0][0]) for r in a["resps"]]
        expected = [float(r[0][0]) for r in b["resps"]]
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
        assert a["acc"] == b["acc"]
    assert sum(s["acc"] for s in ours) == sum(s["acc"] for s in theirs) > 0


def test_generate_until_answers_and_score_equal_the_hf_backend(through_server, through_hf):
    ours, theirs = through_server["jaxpaged_real_gen"], through_hf["jaxpaged_real_gen"]
    assert len(ours) == len(theirs) == 4
    assert [[list(r) for r in s["resps"]] for s in ours] == [[list(r) for r in s["resps"]] for s in theirs]
    assert [s["exact_match"] for s in ours] == [s["exact_match"] for s in theirs]
    assert all(s["resps"][0][0].strip() for s in ours)  # something was generated


# --- the attention-mask trap -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_model(hf_smollm2):
    return hf_smollm2


def hf_greedy(model, ids: list[int], max_new_tokens: int, **generate_kwargs) -> list[int]:
    """transformers' greedy tokens after `ids`, always with the explicit all-ones attention mask (the reference
    path: the prompt's `<|im_end|>` tokens are attended to whatever the pad and EOS ids)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)
    return out[0, len(ids):].tolist()


def test_generate_without_attention_mask_masks_im_end_and_changes_the_answer(server, hf_model):
    """transformers infers a mask hiding every `pad_token_id` of the prompt when no mask is given and the pad id
    is not an EOS id. SmolLM2's pad is `<|im_end|>` (2); with `<|endoftext|>` (0) as EOS, as a caller stopping at
    the vocabulary's end-of-text would pass, the unmasked call drops the turn separators and answers differently."""
    import openai
    import torch

    from jaxpaged.checkpoint import model_config
    from jaxpaged.server.chat import ChatTemplate
    from jaxpaged.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(MODEL, model_config(MODEL))
    text = ChatTemplate.for_model(str(MODEL)).render([{"role": "user", "content": TRAP_QUESTION}])
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2] == [hf_model.config.pad_token_id]
    assert ids.count(2) >= 2  # the system turn and the user turn end with it
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    served = client.completions.create(model=NAME, prompt=ids, max_tokens=12, temperature=0).choices[0].text
    with_mask = hf_greedy(hf_model, ids, 12, pad_token_id=2, eos_token_id=0)
    assert tokenizer.decode(_until(with_mask, 2)) == served and served.strip()
    with torch.no_grad():  # the trap: no mask given, so transformers builds one that hides every <|im_end|>
        no_mask = hf_model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=2,
                                    eos_token_id=0)[0, len(ids):].tolist()
    assert _until(no_mask, 2) != _until(with_mask, 2)


def _until(tokens: list[int], stop: int) -> list[int]:
    """`tokens` up to (without) the first `stop`."""
    return tokens[:tokens.index(stop)] if stop in tokens else tokens
