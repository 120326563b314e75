"""absl flags shared by the benchmark scripts: workload shape and KV budget."""

from __future__ import annotations

from absl import flags

from jaxpaged import compile_cache
from jaxpaged.bench import flag_checks
from jaxpaged.bench.serving import ServingSetup
from jaxpaged.mathutils import cdiv
from jaxpaged.traces import load_trace, trace_workload
from jaxpaged.workloads import (WORKLOADS, WorkloadRequest, assign_arrivals, make_workload,
                                max_context_len)

MODEL = flags.DEFINE_string("model", "small", "a shipped model config name, a config JSON or a checkpoint directory")
NUM_REQUESTS = flags.DEFINE_integer("num_requests", 16, "requests per workload")
REQUEST_RATE = flags.DEFINE_float("request_rate", 0.0, "Poisson arrivals per second; 0 or inf = all at once")
SEED = flags.DEFINE_integer("seed", 0, "workload and arrival seed")
KV_BUDGET = flags.DEFINE_integer("kv_budget_tokens", 8192, "KV pool size in tokens, the same for every mode")
MAX_MODEL_LEN = flags.DEFINE_integer("max_model_len", None,
                                     "longest sequence; the contiguous baseline reserves this per sequence "
                                     "(default: the workload's longest context, rounded up to a block)")
MAX_NUM_SEQS = flags.DEFINE_integer("max_num_seqs", 64, "most sequences running at once")
MAX_BATCHED = flags.DEFINE_integer("max_num_batched_tokens", 512, "token budget of one step")
COMPILE_CACHE = flags.DEFINE_string("compile_cache_dir", compile_cache.AUTO,
                                    "persistent XLA compile cache directory ('auto' = the per-user one, "
                                    "see jaxpaged.compile_cache; '' = off); compile time is excluded anyway")
USE_COMPILE_CACHE = flags.DEFINE_bool("compile_cache", True, "use the persistent XLA compile cache "
                                      "(--nocompile_cache: every start compiles afresh)")
# workload scales: None keeps the workload's own default (see jaxpaged/workloads.py)
_SCALES = {
    "system_len": flags.DEFINE_integer("system_len", None, "shared system prompt tokens (chatbot, multitenant)"),
    "user_len": flags.DEFINE_integer("user_len", None, "user turn tokens (chatbot, multiturn, multitenant)"),
    "prompt_len": flags.DEFINE_integer("prompt_len", None, "prompt tokens (unique)"),
    "output_len": flags.DEFINE_integer("output_len", None, "generated tokens per request"),
    "num_turns": flags.DEFINE_integer("num_turns", None, "turns per conversation (multiturn)"),
    "num_tenants": flags.DEFINE_integer("num_tenants", None, "tenants (multitenant)"),
    "max_prompt_len": flags.DEFINE_integer("max_prompt_len", None, "longest prompt (mixed)"),
    "max_output_len": flags.DEFINE_integer("max_output_len", None, "longest output (mixed)"),
}
TRACE = flags.DEFINE_string("trace", None, "Mooncake-format JSONL trace to serve instead of --workload "
                            "(its requests and arrivals; e.g. data/traces/mooncake_conversation_trace.jsonl)")
TRACE_LIMIT = flags.DEFINE_integer("trace_limit", None, "serve only the trace's first N requests")
TRACE_SCALE = flags.DEFINE_float("trace_time_scale", 1.0, "multiply the trace's timestamps (0.01 = 100x faster)")
flag_checks.model_name("model")
flag_checks.existing_file("trace")
flag_checks.positive("trace_limit")
flag_checks.at_least(1e-9, "trace_time_scale")
flag_checks.positive("num_requests", "kv_budget_tokens", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                     *_SCALES)
flag_checks.non_negative("seed")
flags.register_validator("request_rate", lambda v: v >= 0,  # inf (all at once, as vllm bench serve) is allowed
                         message="--request_rate must be >= 0 (0 or inf = all at once)")

_ACCEPTS = {
    "chatbot": {"system_len", "user_len", "output_len"},
    "unique": {"prompt_len", "output_len"},
    "multiturn": {"num_turns", "user_len", "output_len"},
    "multitenant": {"num_tenants", "system_len", "user_len", "output_len"},
    "mixed": {"max_prompt_len", "max_output_len"},
}
assert set(_ACCEPTS) == set(WORKLOADS)


def workload_from_flags(name: str) -> list[WorkloadRequest]:
    """The workload ``name`` scaled by whichever scale flags were set and apply to it, with arrivals."""
    scales = {key: flag.value for key, flag in _SCALES.items() if flag.value is not None and key in _ACCEPTS[name]}
    if name == "mixed":  # keep the minimums below scaled-down maximums
        scales.setdefault("min_prompt_len", min(16, scales.get("max_prompt_len", 16)))
        scales.setdefault("min_output_len", min(8, scales.get("max_output_len", 8)))
    requests = make_workload(name, num_requests=NUM_REQUESTS.value, seed=SEED.value, **scales)
    return assign_arrivals(requests, REQUEST_RATE.value, seed=SEED.value)


def trace_from_flags() -> list[WorkloadRequest]:
    """``--trace`` as a workload: its first ``--trace_limit`` requests at their timestamps times
    ``--trace_time_scale``, prompts cut to ``--max_model_len`` (their shared heads kept)."""
    return trace_workload(load_trace(TRACE.value, limit=TRACE_LIMIT.value), time_scale=TRACE_SCALE.value,
                          max_model_len=MAX_MODEL_LEN.value)


def enable_compile_cache() -> str | None:
    """Point the persistent XLA compile cache at ``--compile_cache_dir`` (off with ``--nocompile_cache``)."""
    return compile_cache.configure(COMPILE_CACHE.value if USE_COMPILE_CACHE.value else None)


def setup_from_flags(block_size: int, requests: list[WorkloadRequest]) -> ServingSetup:
    """The shared KV budget and engine limits from the flags, in blocks of ``block_size`` tokens.

    Without ``--max_model_len`` the limit is the longest context ``requests`` reach,
    rounded up to whole blocks, so every request is admissible.
    """
    max_model_len = MAX_MODEL_LEN.value
    if max_model_len is None:
        max_model_len = cdiv(max_context_len(requests), block_size) * block_size
    return ServingSetup(num_blocks=KV_BUDGET.value // block_size, block_size=block_size,
                        max_model_len=max_model_len, max_num_seqs=MAX_NUM_SEQS.value,
                        max_num_batched_tokens=MAX_BATCHED.value)
