"""The "before" column of docs/BENCHMARKS.md's host-overhead table: the engine as of commit 415e6ce.

It imports that commit's modules (they no longer exist at HEAD), so run it from a worktree:

    git worktree add /tmp/before 415e6ce
    PYTHONPATH=/tmp/before .venv/bin/python scripts/legacy/host_overhead_415e6ce.py 64,256,512 3

Same workload as scripts/bench_host_overhead.py with a device that takes no time: llama3-8b
shape, ~1.2K-token contexts, N decoding sequences; that engine returned finished requests only
(like FINAL_ONLY outputs). Its runner lays out each step with build_step_input (timed as layout).
"""
import gc, json, statistics, sys, time
import numpy as np
from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.runner import StepOutput
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.step_input import build_step_input
from jaxpaged.sim.runner import fixed_token


class LayoutRunner:
    num_compiles = 0

    def __init__(self, config, block_size):
        self.config, self.block_size, self.layout_s = config, block_size, 0.0
        self.token = fixed_token(config)

    def run_batch(self, batch, *, num_top_logprobs=0):
        start = time.perf_counter()
        build_step_input(batch, self.block_size)
        self.layout_s += time.perf_counter() - start
        n = len(batch)
        return StepOutput(token_ids=np.full(n, self.token, np.int32), logprobs=np.zeros(n, np.float32))

    def copy_blocks(self, pairs):
        pass


class Timer:
    def __init__(self, fn):
        self.fn, self.total = fn, 0.0

    def __call__(self, *a, **k):
        s = time.perf_counter()
        try:
            return self.fn(*a, **k)
        finally:
            self.total += time.perf_counter() - s


def measure(num_seqs, context_len=1200, steps=64, warmup=8, seed=0):
    config = load_config("llama3-8b")
    bs, budget = 16, 16384
    longest = context_len + context_len // 8
    prefill_steps = -(-num_seqs * longest // budget) + 2
    max_tokens = prefill_steps + warmup + steps + 4
    max_len = longest + max_tokens
    num_blocks = num_seqs * (-(-max_len // bs) + 1)
    runner = LayoutRunner(config, bs)
    engine = Engine(EngineConfig(model="llama3-8b", block_size=bs, num_blocks=num_blocks, max_num_seqs=num_seqs,
                                 max_num_batched_tokens=max(num_seqs, budget), max_model_len=max_len,
                                 hash_algo="xxh3_128"), runner=runner)
    rng = np.random.default_rng(seed)
    for i in range(num_seqs):
        length = int(rng.integers(context_len - context_len // 8, longest))
        engine.add_request(f"r{i}", rng.integers(0, config.vocab_size, length).tolist(),
                           SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False))
    while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running):
        engine.step()
    for _ in range(warmup):
        engine.step()
    assert len(engine.scheduler.running) == num_seqs
    sched, proc = Timer(engine.scheduler.schedule), Timer(engine._process)
    engine.scheduler.schedule, engine._process = sched, proc
    rows = {"schedule": [], "layout": [], "update": [], "host": []}
    gc.collect()
    for _ in range(steps):
        s0, p0, l0 = sched.total, proc.total, runner.layout_s
        t = time.perf_counter()
        engine.step()
        rows["host"].append(time.perf_counter() - t)
        rows["schedule"].append(sched.total - s0)
        rows["layout"].append(runner.layout_s - l0)
        rows["update"].append(proc.total - p0)
    return {k: statistics.median(v) * 1e3 for k, v in rows.items()}


if __name__ == "__main__":
    out = {}
    for n in [int(x) for x in sys.argv[1].split(",")]:
        runs = [measure(n) for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3)]
        out[n] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(n, {k: round(v, 3) for k, v in out[n].items()}, flush=True)
    print(json.dumps(out))
