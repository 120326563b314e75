"""The benchmark commands run end to end on the tiny config (in this process) and write valid JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxpaged.cli import main as cli
from tests.suite_cache import SUITE_CACHE


ROOT = Path(__file__).resolve().parents[2]
CACHE = SUITE_CACHE  # the suite's compile cache (tests/suite_cache.py)
TINY = ["--model=tiny", "--num_requests=3", "--system_len=16", "--user_len=8", "--prompt_len=24",
        "--output_len=3", "--kv_budget_tokens=256", "--max_model_len=64", f"--compile_cache_dir={CACHE}"]


def test_bench_serving(tmp_path, run_command):
    out = run_command("bench serving", *TINY, "--progress=false", f"--json_out={tmp_path}/s.json",
                     f"--md_out={tmp_path}/s.md")
    result = json.loads((tmp_path / "s.json").read_text())
    assert set(result["median"]) == {"prefix_on", "prefix_off", "contiguous"}
    for summary in result["median"].values():
        assert summary["num_requests"] == 3
    assert result["median"]["prefix_on"]["prefix_hit_rate"] > 0  # the 16-token system prompt is shared
    assert result["median"]["prefix_off"]["prefix_hit_rate"] == 0
    # 4 regions of 64 tokens in 256: the baseline can never run more than 4
    assert result["median"]["contiguous"]["max_running_seqs"] <= 4
    assert "request_throughput: prefix_on/prefix_off" in result["ratios"]
    assert (tmp_path / "s.md").read_text().startswith("| metric | prefix_on | prefix_off | contiguous |")
    assert "| metric |" in out


def test_ablate_block_size(tmp_path, run_command):
    run_command("bench ablate", *TINY, "--block_sizes=4,16", "--workloads=chatbot,multiturn",
               "--num_turns=2", "--progress=false", f"--json_out={tmp_path}/a.json", f"--plot_dir={tmp_path}/p")
    rows = json.loads((tmp_path / "a.json").read_text())["rows"]
    assert [(r["block_size"], r["workload"]) for r in rows] == [
        (4, "chatbot"), (4, "multiturn"), (16, "chatbot"), (16, "multiturn")]
    assert all(r["num_requests"] == 3 for r in rows)
    assert rows[0]["max_concurrent_seqs"] >= rows[2]["max_concurrent_seqs"]  # coarser blocks round up more
    pngs = sorted(p.name for p in (tmp_path / "p").glob("*.png"))
    assert "block_size_kv_waste.png" in pngs and len(pngs) == 6


def test_profile_serving(tmp_path, run_command):
    out = run_command("bench profile", *TINY, f"--trace_dir={tmp_path}/trace", f"--json_out={tmp_path}/p.json")
    result = json.loads((tmp_path / "p.json").read_text())
    assert 0 < result["host_share"] < 1
    assert result["device_s"] > 0 and result["num_steps"] >= result["device_steps"] > 0
    assert list((tmp_path / "trace").rglob("*.xplane.pb"))
    assert "host share" in out


def test_profile_serving_of_a_checkpoint_directory(tmp_path, run_command):
    """A checkpoint whose BOS/EOS sit in 0-255 gets its own ids-only tokenizer, not a byte one sized to the config."""
    from jaxpaged.checkpoint.hf import save_hf_checkpoint
    from jaxpaged.config import load_config
    from jaxpaged.model import init_model
    save_hf_checkpoint(init_model(load_config("tiny").replace(bos_token_id=1, eos_token_id=2), seed=0),
                       tmp_path / "model")
    flags = [f for f in TINY if not f.startswith("--model=")]
    run_command("bench profile", f"--model={tmp_path / 'model'}", *flags, "--trace_dir=",
                f"--json_out={tmp_path}/p.json")
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["device_s"] > 0 and result["num_steps"] > 0


@pytest.mark.parametrize("dtype, per_token", [("float16", 327_680), ("fp8", 163_840)])
def test_kv_capacity_reference_figures(tmp_path, dtype, per_token, run_command):
    out = run_command("capacity", "--model=llama3-70b", f"--kv_dtype={dtype}", "--budget_gb=45",
                     f"--json_out={tmp_path}/c.json")
    cap = json.loads((tmp_path / "c.json").read_text())
    assert cap["bytes_per_token"] == per_token
    assert cap["bytes_per_block"] == 16 * per_token
    assert cap["num_blocks"] == 45_000_000_000 // (16 * per_token)
    if dtype == "float16":
        assert cap["num_blocks"] == 8583 and "5.24 MB" in out
        assert 140e9 < cap["weight_bytes"] < 142e9  # not ~35 GB


def test_bench_host_overhead(tmp_path, run_command):
    out = run_command("bench host-overhead", "--model=tiny", "--profile=a100-80gb", "--num_seqs=8,16",
                     "--context_len=40", "--steps=4", "--repeats=1", f"--json_out={tmp_path}/h.json",
                     f"--md_out={tmp_path}/h.md")
    result = json.loads((tmp_path / "h.json").read_text())
    assert sorted((r["num_seqs"], r["output_kind"]) for r in result["host"]) == [
        (8, "DELTA"), (8, "FINAL_ONLY"), (16, "DELTA"), (16, "FINAL_ONLY")]
    for r in result["host"]:  # every part was timed, on decode steps with a device that takes no time
        assert min(r["schedule_ms"], r["layout_ms"], r["update_ms"], r["host_ms"]) > 0
        assert r["num_steps"] == 4 and not r["sleep"] and r["step_ms"] >= r["host_ms"]  # host <= step, each step
    assert sorted((r["num_seqs"], r["async_scheduling"]) for r in result["busy"]) == [
        (8, False), (8, True), (16, False), (16, True)]
    assert all(0 < r["device_busy"] <= 1 and r["sleep"] for r in result["busy"])
    assert "| seqs | outputs |" in out and (tmp_path / "h.md").read_text().count("\n|") >= 10


def test_bench_tensor_parallel(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0")
    # a process of its own: the forced device count must be set before JAX starts
    proc = subprocess.run([sys.executable, "-m", "jaxpaged", "bench", "tensor-parallel", "--model=tiny",
                           "--sizes=1,2", "--rounds=1", "--decode_batch=2", "--decode_context=8",
                           "--prefill_len=8", "--block_size=4", f"--json_out={tmp_path}/tp.json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = json.loads((tmp_path / "tp.json").read_text())["results"]
    assert two["pool_bytes_per_device"] * 2 == one["pool_bytes_per_device"]  # tiny's 2 KV heads: one each
    assert one["weight_bytes_per_device"] / 2 < two["weight_bytes_per_device"] < one["weight_bytes_per_device"] * 0.6
    assert "| TP | decode step (ms)" in proc.stdout


def test_kv_capacity_tensor_parallel(tmp_path, run_command):
    run_command("capacity", "--model=llama3-70b", "--kv_dtype=bfloat16", "--budget_gb=40",
               "--tensor_parallel_size=4", f"--json_out={tmp_path}/c.json")
    cap = json.loads((tmp_path / "c.json").read_text())
    assert cap["kv_shards"] == 4 and cap["num_blocks"] == 40 * 10**9 // (327_680 * 16 // 4)


def test_simulate_routing(tmp_path, run_command):
    out = run_command("simulate routing", "--model=tiny", "--kv_cache_gb=0.0002", "--block_size=4",
                     "--max_num_seqs=8", "--max_num_batched_tokens=64", "--workloads=multiturn",
                     "--scales=user_len=16,output_len=8", "--replicas=1,3", "--requests_per_replica=8",
                     "--rate_per_replica=50", f"--json_out={tmp_path}/r.json", f"--md_out={tmp_path}/r.md")
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [(r["num_replicas"], r["policy"]) for r in results] == [
        (n, p) for n in (1, 3) for p in ("prefix_aware", "round_robin", "least_loaded")]
    for r in results:
        assert r["requests"] == 8 * r["num_replicas"] and 0 <= r["goodput_rps"] <= r["throughput_rps"]
    # one replica: every policy sends everything to it, so the runs are identical
    single = [{k: v for k, v in r.items() if k not in ("policy", "wall_s")} for r in results if r["num_replicas"] == 1]
    assert single[0] == single[1] == single[2]
    assert (tmp_path / "r.md").read_text().startswith("| workload | replicas | policy |")
    assert "| multiturn | 3 | prefix_aware |" in out


def test_simulate_serving_refuses_a_pool_it_cannot_size(capsys):
    """A tiny model in an 80 GB budget is ~75M blocks: a usage error naming the flag, not minutes of allocation."""
    code = cli.run(["jaxpaged", "simulate", "serving", "--model=tiny", "--block_size=4", "--num_requests=2"])
    err = capsys.readouterr().err
    assert code == 1 and "FATAL usage error" in err and "--kv_cache_gb" in err, err[-2000:]
