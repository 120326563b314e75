"""Start-up time (`jaxpaged bench startup`): a fresh process's first `generate`, and a server's start to its
first streamed token, each a new Python process of a source tree, with the compile cache off, cold or warm.

`measure` alternates the versions (this tree, a baseline worktree, vLLM with ``vllm_python``) inside every
repeat and reports medians; `padding_costs` times one schedule at further padded step sizes. What each start
measures and the figures: docs/benchmarks/startup.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import numpy as np

from jaxpaged.bench.offline.driver import median_summary
from jaxpaged.bench.online.server_process import ROOT, SERVE_COMMAND, ServerProcess
from jaxpaged.bench.options import option
from jaxpaged.config import DEFAULT_BLOCK_SIZE
from jaxpaged.report import markdown_table


CACHE_STATES = ("off", "cold", "warm")  # no persistent compile cache; an empty one; what `cold` just filled
KINDS = ("generate", "serve")

# runs against any version's public API (LLM, SamplingParams; `Engine.num_compiles`, None in trees older
# than it); the cache is chosen through the environment
_GENERATE_CHILD = r"""
import json, sys, time
start = time.perf_counter()
args = json.loads(sys.argv[1])
import numpy as np
from jaxpaged import LLM
from jaxpaged.sampling_params import SamplingParams
imported = time.perf_counter()
llm = LLM(model=args["model"])
built = time.perf_counter()
vocab = llm.engine.model_config.vocab_size
rng = np.random.default_rng(0)
prompts = [rng.integers(0, min(vocab, 250), int(rng.integers(16, args["max_prompt_len"] + 1))).tolist()
           for _ in range(args["num_prompts"])]
outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args["output_len"], ignore_eos=True),
                    use_tqdm=False)
done = time.perf_counter()
try:
    from jaxpaged.compile_cache import cache_counts
    lookups, hits = cache_counts()
except ImportError:
    lookups = hits = None
print(json.dumps({"import_s": imported - start, "build_s": built - imported, "generate_s": done - built,
                  "compiles": getattr(llm.engine, "num_compiles", None),
                  "cache_lookups": lookups, "cache_hits": hits,
                  "tokens": [o.outputs[0].token_ids for o in outs]}))
"""


@dataclasses.dataclass(frozen=True)
class StartupOptions:
    """What is started, against which older tree, how often; or the padding costs instead."""

    models: tuple[str, ...] = option(("small", "llama-100m"), "shipped model configs to start")
    kinds: tuple[str, ...] = option(KINDS, "generate: a first LLM.generate; serve: server to first token",
                                    choices=KINDS)
    cache_states: tuple[str, ...] = option(CACHE_STATES, "off, cold (empty cache), warm (filled)",
                                           choices=CACHE_STATES)
    baseline_root: str | None = option(None, "a source tree of the older version to compare with")
    repeats: int = option(3, "starts of every kind, model, version and cache state", at_least=1)
    num_prompts: int = option(16, "prompts of the first generate", at_least=1)
    output_len: int = option(32, "greedy tokens per prompt of the first generate", at_least=1)
    vllm_python: str | None = option(None, "also vLLM's LLM() + first generate, cold and warm, through this vLLM "
                                           "install's Python (models as checkpoint directories)")
    padding_costs: bool = option(False, "instead: each model's step time with a size padded further (what merging "
                                        "step shapes would cost)")


@dataclasses.dataclass(frozen=True)
class StartupCase:
    """What one start runs: the model, and the first `generate`'s prompts and output length."""

    model: str
    num_prompts: int = 16
    max_prompt_len: int = 256
    output_len: int = 32
    serve_prompt_len: int = 64
    serve_output_len: int = 8


def _env(root: Path, cache_dir: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    env.pop("XLA_FLAGS", None)  # the default compiler settings a user gets
    env["PYTHONPATH"] = str(root)
    env["JAXPAGED_CACHE_DIR"] = cache_dir or ""
    return env


def first_generate(root: Path, case: StartupCase, cache_dir: str | None, *, timeout_s: float = 1800) -> dict:
    """One fresh process's import, build and first `generate`; its wall time from spawn to exit."""
    args = json.dumps(dataclasses.asdict(case))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _GENERATE_CHILD, args], cwd=root, env=_env(root, cache_dir),
                          capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"the generate process failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["tokens_digest"] = hashlib.sha256(json.dumps(out.pop("tokens")).encode()).hexdigest()[:12]
    return out | {"total_s": wall}


def vllm_first_generate(python: str, case: StartupCase, cache_dir: str) -> dict:
    """vLLM's import, `LLM()` and first `generate` of `case`'s prompts in a fresh process; compile caches in
    `cache_dir`."""
    from jaxpaged.bench.offline.vllm_backend import VllmBackend

    vocab = json.loads((Path(case.model) / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(0)  # the prompts `_GENERATE_CHILD` draws
    prompts = [rng.integers(0, min(vocab, 250), int(rng.integers(16, case.max_prompt_len + 1))).tolist()
               for _ in range(case.num_prompts)]
    start = time.perf_counter()
    vllm = VllmBackend(python, case.model, prompts, output_len=case.output_len,
                       env={"VLLM_CACHE_ROOT": cache_dir, "TORCHINDUCTOR_CACHE_DIR": f"{cache_dir}/inductor"})
    total = time.perf_counter() - start
    vllm.close()
    return {"import_s": total - vllm.load_s - vllm.warmup_s, "build_s": vllm.load_s, "generate_s": vllm.warmup_s,
            "total_s": total}


def _serve_command(root: Path) -> list[str]:
    """How `root`'s tree starts its server: `jaxpaged serve`, or the script a tree before the CLI had."""
    legacy = root / "scripts" / "serve.py"
    return [sys.executable, str(legacy)] if legacy.exists() else [*SERVE_COMMAND]


def first_token(root: Path, case: StartupCase, cache_dir: str | None, *, timeout_s: float = 1800) -> dict:
    """Launch the tree's server, wait for `GET /health`, stream one completion; seconds from launch."""
    server = ServerProcess([f"--model={case.model}"], command=_serve_command(root), cwd=root,
                           env=_env(root, cache_dir), inherit_env=False, startup_timeout_s=timeout_s)
    body = {"model": case.model, "prompt": list(range(1, case.serve_prompt_len + 1)), "temperature": 0,
            "max_tokens": case.serve_output_len, "stream": True}
    start = time.perf_counter()
    try:
        server.start()
        up = time.perf_counter()
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=timeout_s,
                          trust_env=False) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]" and json.loads(line[6:])["choices"]:
                    break
        first = time.perf_counter()
        return {"total_s": first - start, "healthy_s": up - start, "first_token_after_request_s": first - up}
    finally:
        server.stop(60)
        shutil.rmtree(server.log_path.parent, ignore_errors=True)


def has_compile_cache(root: Path) -> bool:
    """Whether the tree at `root` has the persistent compile cache (older trees start without one)."""
    return (root / "jaxpaged" / "compile_cache.py").exists()


def measure(versions: Mapping[str, Path], cases: Sequence[StartupCase], *, kinds: Sequence[str] = KINDS,
            cache_states: Sequence[str] = CACHE_STATES, repeats: int = 3, vllm_python: str | None = None,
            log=print) -> dict:
    """Every (kind, model, version, cache state) start `repeats` times, versions alternating; raw runs and medians.

    A version without the cache is measured once per repeat, as `off`. With
    `vllm_python`, vLLM's first `generate` (`vllm_first_generate`, models as
    checkpoint directories) follows each model's, cold and warm, as version "vllm".
    """
    runs: dict[str, list[dict]] = {}
    work = Path(tempfile.mkdtemp(prefix="jaxpaged-startup-cache-"))
    run_one = {"generate": first_generate, "serve": first_token}
    try:
        for r in range(repeats):
            for case in cases:
                for kind in kinds:
                    for label, root in versions.items():
                        states = cache_states if has_compile_cache(root) else ("off",)
                        cache_dir = work / f"{label}-{kind}-{case.model}"
                        shutil.rmtree(cache_dir, ignore_errors=True)  # cold: empty; warm: what cold left
                        for state in states:
                            key = f"{kind}/{case.model}/{label}/{state}"
                            result = run_one[kind](root, case, None if state == "off" else str(cache_dir))
                            runs.setdefault(key, []).append(result)
                            log(f"repeat {r + 1}/{repeats} {key}: {result['total_s']:.1f} s")
                if vllm_python and "generate" in kinds:
                    cache_dir = work / f"vllm-{Path(case.model).name}"
                    shutil.rmtree(cache_dir, ignore_errors=True)
                    for state in [s for s in cache_states if s != "off"]:
                        key = f"generate/{case.model}/vllm/{state}"
                        runs.setdefault(key, []).append(vllm_first_generate(vllm_python, case, str(cache_dir)))
                        log(f"repeat {r + 1}/{repeats} {key}: {runs[key][-1]['total_s']:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"runs": runs, "median": {key: median_summary(rs) for key, rs in runs.items()}}


def _key_parts(key: str) -> tuple[str, str, str, str]:
    """A run key's kind, model, version label and cache state (the model may be a path with slashes)."""
    kind, rest = key.split("/", 1)
    model, label, state = rest.rsplit("/", 2)
    return kind, model, label, state


def startup_table(result: dict, baseline: str | None = None) -> str:
    """One row per (kind, model, version, cache state): median seconds, compiles, and the ratio to `baseline`.

    `baseline` is a version label; its `off` start of the same kind and model is the ratio's denominator,
    and "same tokens" says whether a `generate` row's greedy tokens equal the baseline's. "up" is the
    import and `LLM` build (`generate`) or launch to a healthy `GET /health` (`serve`).
    """
    header = ["start", "model", "version", "compile cache", "median total (s)", "up (s)", "first call (s)",
              "step shapes", "cache hits / lookups", "same tokens", "vs baseline"]
    rows = []
    for key, m in result["median"].items():
        kind, model, label, state = _key_parts(key)
        base = result["median"].get(f"{kind}/{model}/{baseline}/off") if baseline else None
        ratio = f"{m['total_s'] / base['total_s']:.2f}x" if base else ""
        first = m.get("generate_s", m.get("first_token_after_request_s"))
        up = m["import_s"] + m["build_s"] if "build_s" in m else m["healthy_s"]
        digests = {run.get("tokens_digest") for run in result["runs"][key]}
        base_runs = result["runs"].get(f"{kind}/{model}/{baseline}/off", []) if baseline else []
        same = ""
        if kind == "generate" and base_runs:
            same = "yes" if digests == {run["tokens_digest"] for run in base_runs} else "no"
        hits = (f"{m['cache_hits']:.0f} / {m['cache_lookups']:.0f}" if m.get("cache_lookups") is not None else "")
        compiles = f"{m['compiles']:.0f}" if "compiles" in m else ""
        rows.append([kind, model, label, state, f"{m['total_s']:.1f}", f"{up:.1f}", f"{first:.1f}", compiles, hits,
                     same, ratio])
    return markdown_table(header, rows, align="llll" + "r" * 5 + "lr")


def padding_costs(model_name: str, *, repeats: int = 9, block_size: int = DEFAULT_BLOCK_SIZE) -> list[dict]:
    """Step time of one schedule laid out at different padded sizes (what a bucket merge costs per step).

    Each case is a real schedule (decode rows at a context, prefill chunks) laid
    out by `build_step_input` with one padded size set; the variants alternate
    over `repeats` timed runs after one compiling run. Returns rows of case,
    padding, median ms.
    """
    from jaxpaged.attention.backend import resolve_backend
    from jaxpaged.bench.offline.timing import alternate, seconds_of
    from jaxpaged.checkpoint import load_model
    from jaxpaged.runner import ModelRunner, step_input
    from jaxpaged.runner.buckets import StepBuckets

    runner = ModelRunner(load_model(model_name, seed=0), 2048, block_size, backend=resolve_backend())

    def schedule(num_decodes: int, context: int, prefills: Sequence[int] = ()) -> list:
        seqs, next_block = [], 0
        for tokens, start in [(1, context)] * num_decodes + [(n, 0) for n in prefills]:
            blocks = list(range(next_block, next_block + (start + tokens) // block_size + 1))
            next_block += len(blocks)
            seqs.append(step_input.ScheduledSeq([1] * tokens, start, blocks))
        return seqs

    def padded(seqs, **sizes) -> step_input.StepInput:
        rule = step_input.step_buckets

        def forced(*args, **kwargs) -> StepBuckets:
            return dataclasses.replace(rule(*args, **kwargs), **sizes)
        step_input.step_buckets = forced
        try:
            return step_input.build_step_input(seqs, block_size)
        finally:
            step_input.step_buckets = rule

    cases = {  # the sizes before the merge first, then padded as the merged buckets pad them
        "decode, 1 row, context 200": (schedule(1, 200), [{"blocks_per_seq": 16}, {"blocks_per_seq": 32},
                                                          {"blocks_per_seq": 64}, {"num_decode_rows": 8}]),
        "decode, 16 rows, context 300": (schedule(16, 300), [{"blocks_per_seq": 32}, {"blocks_per_seq": 64}]),
        "1 x 64 prefill": (schedule(0, 0, [64]), [{"blocks_per_seq": 8}, {"blocks_per_seq": 32}]),
        "4 x 128 prefill": (schedule(0, 0, [128] * 4), [{"num_decode_rows": 0}, {"num_decode_rows": 16}]),
        "4 x 128 prefill + 2 decodes": (schedule(2, 200, [128] * 4), [{"num_decode_rows": 2},
                                                                      {"num_decode_rows": 16}]),
    }
    rows = []
    for name, (seqs, variants) in cases.items():
        steps = {i: seconds_of(lambda s=padded(seqs, **v): runner.execute(s)) for i, v in enumerate(variants)}
        times = alternate(steps, repeats, warmup=1).values()  # the first round compiles
        for variant, ts in zip(variants, times):
            rows.append({"case": name, "padding": ", ".join(f"{k} = {v}" for k, v in variant.items()),
                         "median_ms": 1e3 * statistics.median(ts)})
    return rows


def padding_table(rows: Mapping[str, Sequence[dict]]) -> str:
    """`padding_costs` rows per model as a Markdown table."""
    return markdown_table(["model", "step", "padded", "median ms"],
                          [[model, r["case"], r["padding"], f"{r['median_ms']:.1f}"]
                           for model, rs in rows.items() for r in rs], align="lllr")


def startup_report(o: StartupOptions) -> tuple[dict, str]:
    """Every start of every model, this tree alternating with ``o.baseline_root`` when given (or with
    ``o.padding_costs`` each model's `padding_costs` instead): the result and its table."""
    if o.padding_costs:
        rows = {model: padding_costs(model) for model in o.models}
        return {"padding_costs": rows}, padding_table(rows)
    versions = {"this": ROOT} | ({"before": Path(o.baseline_root).resolve()} if o.baseline_root else {})
    cases = [StartupCase(model, num_prompts=o.num_prompts, output_len=o.output_len) for model in o.models]
    result = measure(versions, cases, kinds=o.kinds, cache_states=o.cache_states, repeats=o.repeats,
                     vllm_python=o.vllm_python)
    result["versions"] = {k: str(v) for k, v in versions.items()}
    return result, startup_table(result, "before" if o.baseline_root else None)
