"""`jaxpaged bench throughput`: jaxpaged against Hugging Face transformers on one checkpoint.

transformers' Llama is the independent reference here: the greedy tokens
jaxpaged generates from a checkpoint we wrote must be the ones transformers
generates from it, which also holds our HF checkpoint writer and loader to
the real `LlamaForCausalLM`.
"""

import importlib.util
import json
import sys

import numpy as np
import pytest

from jaxpaged.bench.offline.hf_backend import MISSING_EXTRA, HFBackend
from jaxpaged.bench.offline.throughput import JaxpagedBackend, PromptSpec, hf_checkpoint, make_prompts
from jaxpaged.checkpoint import read_hf_config
from jaxpaged.cli import main as cli
from tests.suite_cache import SUITE_CACHE

# the tests that run transformers need the hf extra (`make test` installs it); the rest run without it
needs_hf = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                              or importlib.util.find_spec("transformers") is None,
                              reason="torch/transformers missing: pip install -e '.[hf]'")

CACHE = SUITE_CACHE  # the suite's compile cache (tests/suite_cache.py)
OUTPUT_LEN = 10


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny config with random weights, saved as a Hugging Face checkpoint."""
    return hf_checkpoint("tiny", tmp_path_factory.mktemp("hf"), seed=5)


@pytest.fixture(scope="module")
def prompts():
    """Prompts of different lengths, so transformers' batches are left-padded."""
    rng = np.random.default_rng(1)
    return [rng.integers(0, 272, size=n).tolist() for n in (3, 17, 9, 30, 12, 24, 5)]


@needs_hf
def test_greedy_tokens_match_transformers(checkpoint, prompts):
    jp = JaxpagedBackend(checkpoint, prompts, output_len=OUTPUT_LEN).measure()
    hf = HFBackend(checkpoint, prompts, output_len=OUTPUT_LEN, batch_size=3).measure()  # 3 padded batches
    assert [len(ids) for ids in jp.token_ids] == [OUTPUT_LEN] * len(prompts)
    assert len({tuple(ids) for ids in jp.token_ids}) == len(prompts)  # the prompts steer different outputs
    assert jp.token_ids == hf.token_ids
    assert jp.num_compiles == 0  # the first call compiled every shape the measured one uses


def test_jaxpaged_counts_the_prompt_tokens_it_computed(checkpoint):
    """Prompts sharing two full blocks: the scheduler holds the rest back until the first has cached them."""
    prefix = list(range(1, 33))
    prompts = [prefix + [40 + i, 50 + i, 60 + i] for i in range(4)]
    run = JaxpagedBackend(checkpoint, prompts, output_len=3).measure()
    assert run.prompt_tokens_computed == 4 * 35 - 3 * 32


@needs_hf
def test_a_one_token_pass_gives_each_prompt_its_first_greedy_token(checkpoint, prompts):
    """`measure(output_len=1)`, the first-token pass: one token per prompt, the first of the full pass's."""
    jp = JaxpagedBackend(checkpoint, prompts, output_len=OUTPUT_LEN)
    full, first = jp.measure(), jp.measure(output_len=1)
    assert first.token_ids == [ids[:1] for ids in full.token_ids]
    assert HFBackend(checkpoint, prompts, output_len=OUTPUT_LEN).measure(output_len=1).token_ids == first.token_ids
    assert len(jp.measure().token_ids[0]) == OUTPUT_LEN  # the backend's own length again


@needs_hf
def test_eos_does_not_stop_either_backend(checkpoint):
    """A prompt whose greedy continuation holds EOS: both backends go on past it (ignore_eos) identically."""
    eos = read_hf_config(checkpoint).eos_token_id
    rng = np.random.default_rng(0)
    candidates = [rng.integers(0, 272, size=8).tolist() for _ in range(48)]
    jp = JaxpagedBackend(checkpoint, candidates, output_len=OUTPUT_LEN).measure()
    with_eos = [p for p, ids in zip(candidates, jp.token_ids) if eos in ids[:-1]]
    assert with_eos, "no candidate prompt generates EOS; pick another seed"
    hf = HFBackend(checkpoint, with_eos, output_len=OUTPUT_LEN).measure()
    assert hf.token_ids == [ids for ids, p in zip(jp.token_ids, candidates) if p in with_eos]


def test_prompts_share_the_prefix_and_repeat_by_seed():
    spec = PromptSpec(num_prompts=5, input_len=20, prefix_len=8, output_len=4, seed=3)
    prompts = make_prompts(spec, vocab_size=100)
    assert [len(p) for p in prompts] == [20] * 5
    assert len({tuple(p[:8]) for p in prompts}) == 1 and len({tuple(p[8:]) for p in prompts}) == 5
    assert all(0 <= t < 100 for p in prompts for t in p)
    assert make_prompts(spec, vocab_size=100) == prompts
    unshared = make_prompts(PromptSpec(5, 20, 0, 4, seed=3), vocab_size=100)
    assert len({tuple(p[:8]) for p in unshared}) == 5


@pytest.mark.parametrize("changes, message", [
    ({"prefix_len": 20}, "prefix_len must be in [0, input_len)"),
    ({"prefix_len": -1}, "prefix_len must be in [0, input_len)"),
    ({"output_len": 0}, "output_len must be at least 1"),
])
def test_prompt_spec_rejects_bad_lengths(changes, message):
    with pytest.raises(ValueError) as err:
        PromptSpec(**({"num_prompts": 2, "input_len": 20, "prefix_len": 4, "output_len": 4} | changes))
    assert message in str(err.value)


def test_hf_checkpoint_rejects_an_unknown_model(tmp_path):
    with pytest.raises(ValueError, match="shipped config"):
        hf_checkpoint("no-such-model", tmp_path)


class Run:
    """What one in-process `jaxpaged bench throughput` call returned and printed."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run the command in this process; with ``block_torch``, ``import torch`` fails as if the extra were missing."""
    def run(*args: str, block_torch: bool = False) -> Run:
        if block_torch:
            monkeypatch.setitem(sys.modules, "torch", None)
        try:
            code = cli.run(["jaxpaged", "bench", "throughput", *args])
        except SystemExit as exit_:
            code = exit_.code
        out = capsys.readouterr()
        return Run(code, out.out, out.err)
    return run


TINY = ["--model=tiny", "--num_prompts=4", "--input_len=20", "--prefix_len=8", f"--output_len={OUTPUT_LEN}",
        f"--compile_cache_dir={CACHE}"]


@needs_hf
def test_cli_runs_both_backends_side_by_side(tmp_path, run_cli):
    proc = run_cli(*TINY, "--backend=both", "--repeats=2", "--first_token_pass", f"--checkpoint_dir={tmp_path}/ck",
                f"--json_out={tmp_path}/t.json", f"--md_out={tmp_path}/t.md")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "t.json").read_text())
    assert set(result["median"]) == {"jaxpaged", "hf"}
    for runs in result["runs"].values():
        assert len(runs) == 2
        for run in runs:
            assert run["num_requests"] == 4
            assert run["prompt_tokens"] == 4 * 20
            assert run["output_tokens"] == 4 * OUTPUT_LEN
            assert run["total_tokens"] == run["prompt_tokens"] + run["output_tokens"]
            assert run["request_throughput"] > 0 and run["warmup_s"] > 0
            assert run["output_token_throughput"] == pytest.approx(run["output_tokens"] / run["elapsed_s"])
            assert run["total_token_throughput"] == pytest.approx(run["total_tokens"] / run["elapsed_s"])
            assert run["tpot_ms"] == pytest.approx(1e3 * (run["elapsed_s"] - run["first_token_pass_s"])
                                                   / (OUTPUT_LEN - 1))
    jp, hf = result["median"]["jaxpaged"], result["median"]["hf"]
    assert jp["num_compiles"] == 0
    ratio = result["ratios"]["output_token_throughput: jaxpaged/hf"]
    assert ratio == pytest.approx(jp["output_token_throughput"] / hf["output_token_throughput"])
    assert result["token_agreement"] == {"hf": 1.0}  # greedy, float32: the same tokens
    assert result["ratios"]["time per output token after the first: hf/jaxpaged"] == pytest.approx(
        hf["tpot_ms"] / jp["tpot_ms"])
    assert (tmp_path / "ck" / "tiny-seed0" / "config.json").is_file()  # the config, saved as HF once
    assert (tmp_path / "t.md").read_text().startswith("| metric | jaxpaged | hf |")
    assert "output_token_throughput: jaxpaged/hf" in proc.stdout
    # every pass computes the same tokens, so its floor is the same and the median ratio is the ratio of medians
    assert jp["gemm_floor_s"] > 0
    assert jp["elapsed_over_gemm_floor"] == pytest.approx(jp["elapsed_s"] / jp["gemm_floor_s"])
    assert jp["prompt_tokens_computed"] <= hf["prompt_tokens_computed"] == 4 * 20
    assert result["ratios"]["largest possible at the GEMM floor: hf elapsed / jaxpaged floor"] == pytest.approx(
        hf["elapsed_s"] / jp["gemm_floor_s"])


@pytest.mark.parametrize("args, message", [
    (["--prefix_len=20"], "--prefix_len must be less than --input_len"),
    (["--backend=sglang"], "--backend must list some of"),
    (["--backend=jaxpaged,vllm"], "--backend=vllm needs --vllm_python=PATH"),
    (["--backend=vllm", "--vllm_python=/no/such/python"], "--vllm_python"),
    (["--output_len=0"], "--output_len must be a finite number >= 1"),
    (["--output_len=1", "--first_token_pass"], "--first_token_pass needs --output_len >= 2"),
    (["--model=no-such-model"], "--model must be a shipped config"),
])
def test_cli_rejects_bad_flags(args, message, run_cli):
    proc = run_cli(*TINY, *args)
    assert proc.returncode != 0
    assert "FATAL Flags parsing error" in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_hf_backend_without_the_extra_says_which_to_install(tmp_path, run_cli):
    proc = run_cli(*TINY, "--backend=hf", f"--checkpoint_dir={tmp_path}/ck", block_torch=True)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if MISSING_EXTRA in line]
    assert len(lines) == 1 and lines[0].startswith("cannot run --backend=hf")
    assert "Traceback" not in proc.stderr


def test_both_without_the_extra_runs_jaxpaged_alone(tmp_path, run_cli):
    proc = run_cli(*TINY, "--backend=both", f"--checkpoint_dir={tmp_path}/ck", f"--json_out={tmp_path}/t.json",
                   f"--md_out={tmp_path}/t.md", block_torch=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(MISSING_EXTRA in line for line in proc.stderr.splitlines()) == 1
    result = json.loads((tmp_path / "t.json").read_text())
    assert list(result["median"]) == ["jaxpaged"] and "ratios" not in result
    assert result["median"]["jaxpaged"]["output_tokens"] == 4 * OUTPUT_LEN
    assert set(result["memory_environment"]) == {"transparent_hugepage", "GLIBC_TUNABLES"}  # the one writer's
    table = (tmp_path / "t.md").read_text()
    assert table.startswith("| metric | jaxpaged |\n|---|---:|") and table in proc.stdout
    tokens_row = next(line for line in table.splitlines() if line.startswith("| output tokens"))
    assert tokens_row.split("|")[2].strip() == str(4 * OUTPUT_LEN)
