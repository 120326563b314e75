"""The benchmark library runs end to end on a tiny config (no timing assertions)."""

import json

from jaxpaged.bench.offline.block_manager import BenchConfig, markdown_table, raw_sha256_chain, run_benchmarks


def test_benchmark_runs_and_reports_every_measure():
    cfg = BenchConfig(num_blocks=64, block_size=16, prompt_len=128, repeats=5)
    results = run_benchmarks(cfg)
    json.dumps(results)  # JSON-ready
    for algo in cfg.hash_algo:
        per_algo = results["per_hash_algo"][algo]
        assert all(value > 0 for value in per_algo.values())
    table = markdown_table(results)
    assert "| admit fully cached / SHA-256 chain |" in table and "xxh3_128" in table


def test_raw_chain_covers_full_blocks_only():
    assert len(raw_sha256_chain(list(range(40)), 16)) == 2
