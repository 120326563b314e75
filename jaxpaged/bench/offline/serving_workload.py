"""`ServingWorkload`: the requests and KV budget ``jaxpaged bench serving``, ``ablate``, ``profile`` and
``http-overhead`` share, as options (beside the engine fields in `SERVING_ENGINE_FIELDS`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jaxpaged.bench.offline.serving import ServingSetup
from jaxpaged.bench.options import option
from jaxpaged.mathutils import cdiv
from jaxpaged.sim.traces import load_trace, trace_workload
from jaxpaged.sim.workloads import WORKLOADS, WorkloadRequest, assign_arrivals, make_workload

# the EngineConfig fields a serving benchmark exposes as flags (compile time is excluded anyway)
SERVING_ENGINE_FIELDS = ["model", "max_num_seqs", "max_num_batched_tokens", "compile_cache_dir", "block_size"]

# which scale options each workload takes
_ACCEPTS = {
    "chatbot": {"system_len", "user_len", "output_len"},
    "unique": {"prompt_len", "output_len"},
    "multiturn": {"num_turns", "user_len", "output_len"},
    "multitenant": {"num_tenants", "system_len", "user_len", "output_len"},
    "mixed": {"max_prompt_len", "max_output_len"},
}
assert set(_ACCEPTS) == set(WORKLOADS)


@dataclasses.dataclass(frozen=True)
class ServingWorkload:
    """A workload's size, arrivals and scales (None keeps the workload's own, jaxpaged/sim/workloads.py), or a
    trace; and the KV budget every mode gets."""

    num_requests: int = option(16, "requests per workload", at_least=1)
    request_rate: float = option(0.0, "Poisson arrivals per second; 0 or inf = all at once", check="rate")
    seed: int = option(0, "workload and arrival seed", at_least=0)
    kv_budget_tokens: int = option(8192, "KV pool size in tokens, the same for every mode", at_least=1)
    max_model_len: int | None = option(None, "longest sequence; the contiguous baseline reserves this per sequence "
                                             "(default: the workload's longest context, rounded up to a block)",
                                       at_least=1)
    system_len: int | None = option(None, "shared system prompt tokens (chatbot, multitenant)", at_least=1)
    user_len: int | None = option(None, "user turn tokens (chatbot, multiturn, multitenant)", at_least=1)
    prompt_len: int | None = option(None, "prompt tokens (unique)", at_least=1)
    output_len: int | None = option(None, "generated tokens per request", at_least=1)
    num_turns: int | None = option(None, "turns per conversation (multiturn)", at_least=1)
    num_tenants: int | None = option(None, "tenants (multitenant)", at_least=1)
    max_prompt_len: int | None = option(None, "longest prompt (mixed)", at_least=1)
    max_output_len: int | None = option(None, "longest output (mixed)", at_least=1)
    trace: str | None = option(None, "Mooncake-format JSONL trace to serve instead of --workload (its requests "
                                     "and arrivals; e.g. data/traces/mooncake_conversation_trace.jsonl)",
                               check="existing_file")
    trace_limit: int | None = option(None, "serve only the trace's first N requests", at_least=1)
    trace_time_scale: float = option(1.0, "multiply the trace's timestamps (0.01 = 100x faster)", at_least=1e-9)

    def workload(self, name: str) -> list[WorkloadRequest]:
        """The workload ``name`` scaled by whichever scales are set and apply to it, with arrivals."""
        scales = {key: getattr(self, key) for key in _ACCEPTS[name] if getattr(self, key) is not None}
        if name == "mixed":  # keep the minimums below scaled-down maximums
            scales.setdefault("min_prompt_len", min(16, scales.get("max_prompt_len", 16)))
            scales.setdefault("min_output_len", min(8, scales.get("max_output_len", 8)))
        requests = make_workload(name, num_requests=self.num_requests, seed=self.seed, **scales)
        return assign_arrivals(requests, self.request_rate, seed=self.seed)

    def requests(self, name: str) -> list[WorkloadRequest]:
        """The trace when there is one (its first ``trace_limit`` requests at their timestamps times
        ``trace_time_scale``, prompts cut to ``max_model_len``, their shared heads kept), else the workload ``name``."""
        if not self.trace:
            return self.workload(name)
        return trace_workload(load_trace(self.trace, limit=self.trace_limit), time_scale=self.trace_time_scale,
                              max_model_len=self.max_model_len)

    def setup(self, engine: Mapping[str, object], longest_context: int) -> ServingSetup:
        """The KV budget in blocks and the engine limits (``engine``: the `EngineConfig` fields the command took);
        without ``max_model_len``, the longest context the requests reach in whole blocks."""
        block_size = engine["block_size"]
        max_model_len = self.max_model_len or cdiv(longest_context, block_size) * block_size
        limits = {k: v for k, v in engine.items() if k in {f.name for f in dataclasses.fields(ServingSetup)}}
        return ServingSetup(**(limits | {"num_blocks": self.kv_budget_tokens // block_size,
                                         "max_model_len": max_model_len}))
