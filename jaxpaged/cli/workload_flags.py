"""Flags the serving benchmarks share: workload shape, trace, KV budget and engine limits."""

from __future__ import annotations

from jaxpaged import compile_cache
from jaxpaged.bench.offline.serving import ServingSetup
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.mathutils import cdiv
from jaxpaged.sim.traces import load_trace, trace_workload
from jaxpaged.sim.workloads import (WORKLOADS, WorkloadRequest, assign_arrivals, make_workload,
                                max_context_len)

# which scale flags each workload takes
_ACCEPTS = {
    "chatbot": {"system_len", "user_len", "output_len"},
    "unique": {"prompt_len", "output_len"},
    "multiturn": {"num_turns", "user_len", "output_len"},
    "multitenant": {"num_tenants", "system_len", "user_len", "output_len"},
    "mixed": {"max_prompt_len", "max_output_len"},
}
assert set(_ACCEPTS) == set(WORKLOADS)


class WorkloadFlags:
    """The workload, KV budget and engine-limit flags the serving benchmarks share, on one command's flags."""

    def __init__(self, fs: FlagSet) -> None:
        """Define the flags on ``fs``."""
        self.engine = EngineFlags(fs, ["model", "max_num_seqs", "max_num_batched_tokens", "compile_cache_dir"],
                                  defaults={"model": "small"})
        self.MODEL = self.engine.holders["model"]
        self.MAX_NUM_SEQS = self.engine.holders["max_num_seqs"]
        self.MAX_BATCHED = self.engine.holders["max_num_batched_tokens"]
        self.COMPILE_CACHE = self.engine.holders["compile_cache_dir"]  # compile time is excluded anyway
        self.NUM_REQUESTS = fs.DEFINE_integer("num_requests", 16, "requests per workload")
        self.REQUEST_RATE = fs.DEFINE_float("request_rate", 0.0, "Poisson arrivals per second; 0 or inf = all at once")
        self.SEED = fs.DEFINE_integer("seed", 0, "workload and arrival seed")
        self.KV_BUDGET = fs.DEFINE_integer("kv_budget_tokens", 8192, "KV pool size in tokens, the same for every mode")
        self.MAX_MODEL_LEN = fs.DEFINE_integer("max_model_len", None,
                                             "longest sequence; the contiguous baseline reserves this per sequence "
                                             "(default: the workload's longest context, rounded up to a block)")
        # workload scales: None keeps the workload's own default (see jaxpaged/sim/workloads.py)
        self._SCALES = {
            "system_len": fs.DEFINE_integer("system_len", None, "shared system prompt tokens (chatbot, multitenant)"),
            "user_len": fs.DEFINE_integer("user_len", None, "user turn tokens (chatbot, multiturn, multitenant)"),
            "prompt_len": fs.DEFINE_integer("prompt_len", None, "prompt tokens (unique)"),
            "output_len": fs.DEFINE_integer("output_len", None, "generated tokens per request"),
            "num_turns": fs.DEFINE_integer("num_turns", None, "turns per conversation (multiturn)"),
            "num_tenants": fs.DEFINE_integer("num_tenants", None, "tenants (multitenant)"),
            "max_prompt_len": fs.DEFINE_integer("max_prompt_len", None, "longest prompt (mixed)"),
            "max_output_len": fs.DEFINE_integer("max_output_len", None, "longest output (mixed)"),
        }
        self.TRACE = fs.DEFINE_string("trace", None, "Mooncake-format JSONL trace to serve instead of --workload "
                                    "(its requests and arrivals; e.g. data/traces/mooncake_conversation_trace.jsonl)")
        self.TRACE_LIMIT = fs.DEFINE_integer("trace_limit", None, "serve only the trace's first N requests")
        self.TRACE_SCALE = fs.DEFINE_float("trace_time_scale", 1.0, "multiply the trace's timestamps (0.01 = 100x faster)")
        fs.existing_file("trace")
        fs.positive("trace_limit")
        fs.at_least(1e-9, "trace_time_scale")
        fs.positive("num_requests", "kv_budget_tokens", "max_model_len", *self._SCALES)
        fs.non_negative("seed")
        fs.register_validator("request_rate", lambda v: v >= 0,  # inf (all at once, as vllm bench serve) is allowed
                              message="--request_rate must be >= 0 (0 or inf = all at once)")

    def workload_from_flags(self, name: str) -> list[WorkloadRequest]:
        """The workload ``name`` scaled by whichever scale flags were set and apply to it, with arrivals."""
        scales = {key: flag.value for key, flag in self._SCALES.items()
                  if flag.value is not None and key in _ACCEPTS[name]}
        if name == "mixed":  # keep the minimums below scaled-down maximums
            scales.setdefault("min_prompt_len", min(16, scales.get("max_prompt_len", 16)))
            scales.setdefault("min_output_len", min(8, scales.get("max_output_len", 8)))
        requests = make_workload(name, num_requests=self.NUM_REQUESTS.value, seed=self.SEED.value, **scales)
        return assign_arrivals(requests, self.REQUEST_RATE.value, seed=self.SEED.value)

    def trace_from_flags(self) -> list[WorkloadRequest]:
        """``--trace`` as a workload: its first ``--trace_limit`` requests at their timestamps times
        ``--trace_time_scale``, prompts cut to ``--max_model_len`` (their shared heads kept)."""
        return trace_workload(load_trace(self.TRACE.value, limit=self.TRACE_LIMIT.value),
                              time_scale=self.TRACE_SCALE.value, max_model_len=self.MAX_MODEL_LEN.value)

    def enable_compile_cache(self) -> str | None:
        """Point the persistent XLA compile cache at ``--compile_cache_dir`` (``''``: off); the directory or None."""
        return compile_cache.configure(self.COMPILE_CACHE.value)

    def setup_from_flags(self, block_size: int, requests: list[WorkloadRequest]) -> ServingSetup:
        """The shared KV budget and engine limits from the flags, in blocks of ``block_size`` tokens.

        Without ``--max_model_len`` the limit is the longest context ``requests`` reach,
        rounded up to whole blocks, so every request is admissible.
        """
        max_model_len = self.MAX_MODEL_LEN.value
        if max_model_len is None:
            max_model_len = cdiv(max_context_len(requests), block_size) * block_size
        return ServingSetup(num_blocks=self.KV_BUDGET.value // block_size, block_size=block_size,
                            max_model_len=max_model_len, max_num_seqs=self.MAX_NUM_SEQS.value,
                            max_num_batched_tokens=self.MAX_BATCHED.value)
