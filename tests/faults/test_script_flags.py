"""Every script refuses a bad flag value with one error line naming the flag and a non-zero exit, no traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BAD = [
    ("ablate_block_size.py", "--block_sizes=16,0", "block_sizes"),
    ("ablate_block_size.py", "--model=no-such-model", "model"),
    ("bench_attention.py", "--block_size=0", "block_size"),
    ("bench_block_manager.py", "--hash_algo=md5", "hash_algo"),
    ("bench_host_overhead.py", "--num_seqs=64,x", "num_seqs"),
    ("bench_offload.py", "--parts=bogus", "parts"),
    ("bench_serving.py", "--block_size=0", "block_size"),
    ("bench_serving.py", "--request_rate=-1", "request_rate"),
    ("bench_serving.py", "--modes=prefix_on,fast", "modes"),
    ("bench_serving.py", "--burstiness=0", "burstiness"),
    ("bench_serving.py", "--max_concurrency=0", "max_concurrency"),
    ("bench_serving.py", "--dataset_name=sharegpt4", "dataset_name"),
    ("bench_http_overhead.py", "--repeats=0", "repeats"),
    ("bench_step.py", "--repeats=0", "repeats"),
    ("bench_cpu_efficiency.py", "--prefill_lens=512,0", "prefill_lens"),
    ("bench_throughput.py", "--num_prompts=0", "num_prompts"),
    ("calibrate_cpu_profile.py", "--num_blocks=-3", "num_blocks"),
    ("convert_checkpoint.py", "--dtype=int4", "dtype"),
    ("kv_capacity.py", "--budget_gb=nan", "budget_gb"),
    ("kv_capacity.py", "--kv_dtype=int3", "kv_dtype"),
    ("profile_serving.py", "--block_size=0", "block_size"),
    ("simulate_serving.py", "--profile=tpu-v9", "profile"),
    ("simulate_serving.py", "--scales=output_len", "scales"),
    ("simulate_routing.py", "--policies=prefix_aware,random", "policies"),
    ("simulate_routing.py", "--replicas=8,0", "replicas"),
    ("serve.py", "--port=0", "port"),
    ("serve.py", "--kv_cache_dtype=int4", "kv_cache_dtype"),
    ("serve.py", "--data_parallel_size=0", "data_parallel_size"),
    ("serve.py", "--device_profile=tpu-v9", "device_profile"),
    ("serve.py", "--max_request_body_bytes=0", "max_request_body_bytes"),
    ("bench_prompt_stall.py", "--repeats=0", "repeats"),
    ("bench_replicas.py", "--replicas=2,0", "replicas"),
    ("bench_replicas.py", "--policies=prefix_aware,random", "policies"),
    ("bench_tensor_parallel.py", "--sizes=1,0", "sizes"),
    ("replay_cache.py", "--trace=no/such/trace.jsonl", "trace"),
    ("check_dashboard.py", "--traffic_s=0", "traffic_s"),
    ("run_lm_eval.py", "--num_concurrent=0", "num_concurrent"),
    ("bench_logit_controls.py", "--prefill_len=1", "prefill_len"),
    ("bench_engine_core.py", "--concurrency=64,0", "concurrency"),
    ("simulate_hybrid_kv.py", "--max_tokens=0", "max_tokens"),
    ("bench_hybrid_kv.py", "--window=0", "window"),
    ("bench_startup.py", "--repeats=0", "repeats"),
]


def test_every_script_is_covered():
    scripts = {p.name for p in (ROOT / "scripts").glob("*.py")}
    assert scripts == {name for name, _, _ in BAD}


@pytest.mark.parametrize("script, arg, flag", BAD)
def test_bad_flag_value_is_one_line_and_a_non_zero_exit(script, arg, flag):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), arg], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and f"--{flag}" in errors[0], proc.stderr[-2000:]


@pytest.mark.parametrize("script", ["simulate_serving.py", "kv_capacity.py"])
def test_quick_scripts_run_with_their_defaults(script):
    """The scripts cheap enough for the suite run with no flags at all (the others' defaults are GPU/minutes-scale)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()
