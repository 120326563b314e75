"""Every `jaxpaged` command: its words on the command line, the module that holds it, one line of help.

A command module defines ``FLAGS`` (a `FlagSet`) and ``main(argv)``; it is
imported only when its command runs, so starting one command never imports
another's dependencies (Ray, torch, uvicorn).
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType


@dataclasses.dataclass(frozen=True)
class Command:
    """One command: ``words`` as typed after ``jaxpaged``, the ``module`` that runs it, and its help line."""

    words: tuple[str, ...]
    module: str
    help: str

    @property
    def name(self) -> str:
        """The words joined: ``"bench throughput"``."""
        return " ".join(self.words)

    def load(self) -> ModuleType:
        """Import the command's module (its flags are defined then)."""
        return importlib.import_module(self.module)


def _c(words: str, module: str, help: str) -> Command:
    return Command(tuple(words.split()), f"jaxpaged.cli.{module}", help)


COMMANDS: tuple[Command, ...] = (
    _c("serve", "serve", "OpenAI-compatible HTTP server over one engine (or replicas on Ray Serve)"),
    _c("proxy", "proxy", "disaggregation proxy: a prefill engine for the prompt, then a decode engine"),
    _c("bench serving", "bench.serving", "one workload through the KV modes side by side, offline or over HTTP"),
    _c("bench throughput", "bench.throughput", "offline throughput against Hugging Face transformers"),
    _c("bench latency", "bench.latency", "end-to-end latency of one batch of requests, over repeated runs"),
    _c("bench ablate", "bench.ablate", "block-size ablation: one KV budget swept over block sizes and workloads"),
    _c("bench offload", "bench.offload", "the memory tiers and the fp8 KV cache"),
    _c("bench replicas", "bench.replicas", "routing policies over engine replicas on Ray Serve"),
    _c("bench attention", "bench.attention", "paged attention kernels beside the XLA gather and dense attention"),
    _c("bench step", "bench.step", "one prefill and one decode step of a model, timed"),
    _c("bench startup", "bench.startup", "first generate and server start to first token, cold and warm compile cache"),
    _c("bench engine-core", "bench.engine_core", "the engine core in-process against its own process"),
    _c("bench block-manager", "bench.block_manager", "host-side cost of the KV cache manager"),
    _c("bench cpu-efficiency", "bench.cpu_efficiency", "a step against its matmul floor on this CPU"),
    _c("bench host-overhead", "bench.host_overhead", "host overhead of a step at GPU batch sizes (simulated device)"),
    _c("bench http-overhead", "bench.http_overhead", "the same request set offline and over HTTP"),
    _c("bench quality", "bench.quality", "real-text perplexity and fp8-vs-bf16 agreement on the pretrained model"),
    _c("bench hybrid-kv", "bench.hybrid_kv", "sliding-window KV cache groups against one full-attention pool"),
    _c("bench logit-controls", "bench.logit_controls", "what logit controls and prompt logprobs cost a step"),
    _c("bench prompt-stall", "bench.prompt_stall", "how long a long prompt stalls running decodes"),
    _c("bench disagg", "bench.disagg", "colocated vs one prefill + one decode process, and the KV transports"),
    _c("bench spec-decode", "bench.spec_decode", "n-gram speculative decoding on vs off, at several batch sizes"),
    _c("bench tensor-parallel", "bench.tensor_parallel", "step time and memory per device at several TP sizes"),
    _c("bench profile", "bench.profile", "a jax.profiler trace of a workload and the host share of step time"),
    _c("bench replay-cache", "bench.replay_cache", "a request trace replayed through the cache manager alone"),
    _c("simulate serving", "simulate.serving", "the serving simulator: request-rate sweeps on a device profile"),
    _c("simulate routing", "simulate.routing", "routing policies over simulated replicas"),
    _c("simulate hybrid-kv", "simulate.hybrid_kv", "hybrid KV cache groups in the simulator"),
    _c("simulate disagg", "simulate.disagg", "colocated against prefill:decode splits of the same devices, SLO goodput"),
    _c("simulate spec-decode", "simulate.spec_decode", "the cost model's projection of speculative decoding"),
    _c("simulate tenants", "simulate.tenants", "two tenants under overload, under each scheduling policy"),
    _c("calibrate", "calibrate", "fit the cpu device profile to this machine and validate it"),
    _c("convert", "convert", "convert a Hugging Face checkpoint or a GGUF file to an Orbax one"),
    _c("capacity", "capacity", "KV cache capacity of a model on a memory budget"),
    _c("check-dashboard", "check_dashboard", "run the shipped Grafana dashboard's queries against a live server"),
    _c("lm-eval", "lm_eval", "lm-evaluation-harness against a live server"),
)


def find(argv: list[str]) -> tuple[Command | None, int]:
    """The command ``argv[1:3]`` names and how many words it took (``(None, 0)`` when none matches)."""
    for size in (2, 1):
        words = tuple(argv[1:1 + size])
        for command in COMMANDS:
            if command.words == words:
                return command, size
    return None, 0
