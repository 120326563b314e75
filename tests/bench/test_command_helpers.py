"""Small pieces the commands hand to servers: the replicas' environment, the http-overhead server's flags."""

from jaxpaged.bench.offline.serving_workload import ServingWorkload
from jaxpaged.bench.online.http_overhead import serve_args
from jaxpaged.bench.online.replicas import replica_env


def test_replica_env_keeps_the_callers_xla_flags_first_and_shares_the_compile_cache(tmp_path):
    env = replica_env(str(tmp_path), xla_flags="--xla_foo=1")
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_cpu_multi_thread_eigen=false"
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path) and env["JAX_ENABLE_COMPILATION_CACHE"] == "true"
    env = replica_env("", xla_flags="")
    assert env == {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false", "RAY_USAGE_STATS_ENABLED": "0",
                   "JAX_ENABLE_COMPILATION_CACHE": "false", "JAX_COMPILATION_CACHE_DIR": ""}


def test_the_http_overhead_server_gets_the_offline_engines_settings():
    engine = {"model": "tiny", "block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 256,
              "compile_cache_dir": ""}
    setup = ServingWorkload(kv_budget_tokens=1000).setup(engine, longest_context=50)
    assert (setup.num_blocks, setup.max_model_len) == (62, 64)  # 1000 // 16 blocks; 50 tokens -> 4 blocks
    assert serve_args("tiny", setup, ["--x=1"]) == [
        "--model=tiny", "--block_size=16", "--kv_budget_tokens=992", "--max_model_len=64", "--max_num_seqs=8",
        "--max_num_batched_tokens=256", "--x=1"]
    assert ServingWorkload(kv_budget_tokens=1000, max_model_len=100).setup(engine, 50).max_model_len == 100
