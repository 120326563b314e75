"""Host overhead of `Engine.step` at GPU batch sizes over a stand-in device (`jaxpaged bench host-overhead`).

A `SleepingDeviceRunner` (`jaxpaged.sim.sleeping_runner`) lays out every step with the real code and queues its
predicted time on a FIFO of deadlines; engine, scheduler, cache manager and output processor are the real ones
(docs/benchmarks/host-overhead.md).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import platform
import statistics
import time
from collections.abc import Iterable, Sequence

import numpy as np

from jaxpaged.bench.options import option
from jaxpaged.checkpoint import model_config
from jaxpaged.config import DEFAULT_BLOCK_SIZE
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.report import markdown_table
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import get_profile
from jaxpaged.sim.sleeping_runner import SleepingDeviceRunner
from jaxpaged.structured import StructuredOutputsParams


_ROW_SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, '
               '"age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string", '
               '"format": "email"}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}}, '
               '"required": ["name", "age", "tags"]}')
# never complete: rows keep decoding for the whole measurement, as an extraction of many records would
STRUCTURED_GRAMMAR = f'start: (row "\\n")+\nrow: %json {_ROW_SCHEMA}'


@dataclasses.dataclass(frozen=True)
class HostOverhead:
    """Per-step medians (milliseconds) over the measured decode steps, and the device-busy fraction."""

    num_seqs: int
    async_scheduling: bool
    sleep: bool
    output_kind: str
    schedule_ms: float
    layout_ms: float
    update_ms: float
    outputs_ms: float
    host_ms: float  # the whole step minus waiting for the device (and the stand-in predicting its time)
    device_ms: float  # predicted device time per step
    step_ms: float  # wall time per step
    device_busy: float  # fraction of the measured wall time the device spent in steps (1.0 without sleep)
    us_per_seq: float  # host_ms per sequence, in microseconds
    num_steps: int
    wire_ms: float = 0.0  # engine_core: packing and encoding the step's message
    structured: bool = False  # every sequence under a grammar (masks filled and matchers advanced each step)
    cpu_ms: float = 0.0  # CPU time of the engine's thread per step (robust where the host waits for a core)


def measure_host_overhead(num_seqs: int, *, model: str = "llama3-8b", profile: str = "h200-141gb",
                          context_len: int = 1200, steps: int = 64, warmup_steps: int = 8,
                          async_scheduling: bool = True, sleep: bool = True,
                          output_kind: RequestOutputKind = RequestOutputKind.DELTA, detokenize: bool = False,
                          seed: int = 0, engine_core: bool = False, structured: bool = False) -> HostOverhead:
    """Serve `num_seqs` decodes of ~`context_len` tokens; time `steps` steps after the prompts are in.

    Per step: the engine's parts (schedule, input layout, update, outputs) and the whole step minus the
    wait for the device. `sleep=False`: the device takes no time (all host time); `sleep=True`: the
    device-busy fraction shows how much host work hides under the steps. `engine_core`: the engine set up
    as the core process runs it, each step's outputs also packed and encoded (`wire_ms`, part of
    `host_ms`). `structured`: every sequence under `STRUCTURED_GRAMMAR` over a synthetic BPE vocabulary
    of the model's size (masks filled, matchers advanced; the stand-in draws among allowed tokens).
    """
    config = model_config(model)
    block_size = DEFAULT_BLOCK_SIZE
    budget = 16384  # prompts go in fast; the measured steps are pure decodes whatever the budget
    cost_model = CostModel(config, get_profile(profile), block_size=block_size)
    longest = context_len + context_len // 8
    prefill_steps = cdiv(num_seqs * longest, budget) + 2  # early prompts decode while later ones go in
    max_tokens = prefill_steps + warmup_steps + steps + 4
    max_len = longest + max_tokens
    num_blocks = num_seqs * (cdiv(max_len, block_size) + 1)
    runner = SleepingDeviceRunner(config, cost_model, num_blocks, sleep=False)  # no sleeping until measured
    tokenizer = constraint = None
    if structured:
        from jaxpaged.bench.offline.synthetic_tokenizer import synthetic_bpe_tokenizer
        tokenizer = synthetic_bpe_tokenizer(config.vocab_size)
        runner.avoid_tokens |= set(tokenizer.stop_token_ids)
        constraint = StructuredOutputsParams(grammar=STRUCTURED_GRAMMAR)
    engine = Engine(EngineConfig(model=model, block_size=block_size, num_blocks=num_blocks, max_num_seqs=num_seqs,
                                 max_num_batched_tokens=max(num_seqs, budget), max_model_len=max_len,
                                 async_scheduling=async_scheduling, hash_algo="xxh3_128"),
                    runner=runner, tokenizer=tokenizer)
    wire = _core_wire(engine) if engine_core else None
    rng = np.random.default_rng(seed)
    for i in range(num_seqs):
        length = int(rng.integers(context_len - context_len // 8, longest))
        engine.add_request(f"r{i}", rng.integers(0, config.vocab_size, length).tolist(),
                           SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                          detokenize=detokenize, output_kind=output_kind,
                                          structured_outputs=constraint))
    while not _all_decoding(engine, num_seqs):
        engine.step()  # prompts, in chunks of the token budget
    for _ in range(warmup_steps):
        engine.step()
    assert _all_decoding(engine, num_seqs), "every sequence must be decoding while measured"
    runner.sleep = sleep

    samples: dict[str, list[float]] = collections.defaultdict(list)
    device0 = runner.device_s
    gc.collect()
    begin = time.perf_counter()
    for _ in range(steps):
        before = engine.step_phase_seconds()
        layout0, wait0, predict0 = runner.layout.total_s, runner.wait_s, runner.predict_s
        cpu0 = time.thread_time()
        start = time.perf_counter()
        outputs = engine.step()
        wire_start = time.perf_counter()
        if wire is not None:
            wire(outputs)
        end_step = time.perf_counter()
        samples["cpu"].append(time.thread_time() - cpu0)
        step_s = end_step - start
        samples["wire"].append(end_step - wire_start)
        for name, total in engine.step_phase_seconds().items():
            samples[name].append(total - before[name])
        samples["layout"].append(runner.layout.total_s - layout0)
        samples["host"].append(step_s - (runner.wait_s - wait0) - (runner.predict_s - predict0))
        samples["step"].append(step_s)
    end = time.perf_counter()
    device = runner.device_s - device0
    runner.close()
    busy = runner.busy_seconds(begin, end) / (end - begin) if sleep else 1.0
    ms = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    return HostOverhead(num_seqs, async_scheduling, sleep, output_kind.name, ms["schedule"], ms["layout"],
                        ms["update"], ms["outputs"], ms["host"], device / steps * 1e3, ms["step"],
                        busy, ms["host"] / num_seqs * 1e3, steps, ms["wire"], ms["cpu"], structured)


def _all_decoding(engine: Engine, num_seqs: int) -> bool:
    """Whether nothing waits and the last step scheduled one token for each of the `num_seqs` sequences."""
    load, stats = engine.load(), engine.stats
    return (load.num_waiting == 0 and load.num_running == num_seqs
            and stats.last_step_seqs == stats.last_step_tokens == num_seqs)


def _core_wire(engine: Engine):
    """Set `engine` up as the engine core runs it; returns what packs a step's outputs into the core's message."""
    import msgspec

    from jaxpaged.metrics import attach_metrics
    from jaxpaged.server.core import messages as M
    from jaxpaged.server.core.core_outputs import CoreOutputProcessor, to_delta

    engine.set_output_processor(CoreOutputProcessor(lambda: engine.tokenizer))
    attach_metrics(engine)
    encode = msgspec.msgpack.Encoder().encode
    return lambda outputs: encode(M.StepOutputs([to_delta(o) for o in outputs]))


PARTS = ("schedule_ms", "layout_ms", "update_ms", "outputs_ms", "host_ms", "us_per_seq")


def median_fields(runs: Iterable[HostOverhead], fields: Sequence[str]) -> dict[str, float]:
    """The median of each of ``fields`` over ``runs``."""
    runs = list(runs)
    return {f: statistics.median(getattr(r, f) for r in runs) for f in fields}


@dataclasses.dataclass(frozen=True)
class HostOverheadSweep:
    """The batch sizes, output kinds and repeats swept, and what every run shares (model shape, device profile)."""

    model: str = "llama3-8b"
    num_seqs: tuple[int, ...] = option((64, 256, 512), "running decode sequences per step", at_least=1)
    output_kinds: tuple[str, ...] = option(("delta", "final_only"), "output kinds of the host-time rows (delta: "
                                           "what a streaming server asks for)",
                                           choices=[k.name.lower() for k in RequestOutputKind])
    repeats: int = option(3, "runs per configuration (medians reported)", at_least=1)
    profile: str = option("h200-141gb", "device profile whose step times the stand-in sleeps", check="device_profile")
    context_len: int = option(1200, "mean context length (prompts span +-1/8 of it)", at_least=1)
    steps: int = option(64, "decode steps measured per run", at_least=1)
    detokenize: bool = option(False, "stream text too (the stand-in's token is one fixed id)")
    structured: bool = option(False, "every sequence under a JSON-lines grammar over a synthetic BPE vocabulary of "
                                     "the model's size: token masks filled and matchers advanced each step")


def sweep_host_overhead(sweep: HostOverheadSweep) -> dict[str, dict[tuple, list[HostOverhead]]]:
    """Runs by batch size, repeated and interleaved: ``"host"`` time per output kind (a device taking no time,
    keyed (sequences, kind)), then ``"busy"`` with each step taking its predicted time, asynchronous scheduling
    off and on (the first kind's outputs; keyed (sequences, async))."""
    common = dict(model=sweep.model, profile=sweep.profile, context_len=sweep.context_len, steps=sweep.steps,
                  detokenize=sweep.detokenize, structured=sweep.structured)
    kinds = [RequestOutputKind[k.upper()] for k in sweep.output_kinds]
    runs: dict[str, dict[tuple, list[HostOverhead]]] = {"host": {}, "busy": {}}
    for repeat in range(sweep.repeats):  # interleaved: machine load drifts over every configuration alike
        for n in sweep.num_seqs:
            for kind in kinds:
                run = measure_host_overhead(n, sleep=False, output_kind=kind, seed=repeat, **common)
                runs["host"].setdefault((n, kind.name), []).append(run)
                print(f"{n} seqs, {kind.name}: host {run.host_ms:.3f} ms", flush=True)
            for async_scheduling in (False, True):
                run = measure_host_overhead(n, async_scheduling=async_scheduling, output_kind=kinds[0], seed=repeat,
                                            **common)
                runs["busy"].setdefault((n, async_scheduling), []).append(run)
                print(f"{n} seqs, async={async_scheduling}: device busy {run.device_busy:.3f}", flush=True)
    return runs


def host_overhead_tables(runs: dict[str, dict[tuple, list[HostOverhead]]], sweep: HostOverheadSweep) -> str:
    """A title naming the setting and the machine, the host-time table and the device-busy table (medians)."""
    lines = [f"Host time per decode step (ms, medians of {sweep.repeats} runs x {sweep.steps} steps), "
             f"{sweep.model} shape, ~{sweep.context_len}-token contexts, device stand-in: {sweep.profile}"
             f"{', every sequence under a JSON-lines grammar' if sweep.structured else ''}; "
             f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}", ""]
    host_rows = []
    for (n, kind), done in runs["host"].items():
        values = list(median_fields(done, PARTS).values())
        host_rows.append([n, kind, *(f"{v:.3f}" for v in values[:5]), f"{values[5]:.2f}"])
    lines.append(markdown_table(["seqs", "outputs", "schedule", "layout", "update", "outputs", "whole step (host)",
                                 "us / seq"], host_rows, align="rlrrrrrr"))
    lines += ["", "Device busy while each step takes its predicted time (the stand-in's worker thread sleeps it)", ""]
    busy_rows = []
    for (n, async_scheduling), done in runs["busy"].items():
        m = median_fields(done, ("device_ms", "host_ms", "step_ms", "device_busy"))
        busy_rows.append([n, f"{m['device_ms']:.2f}", "async" if async_scheduling else "sync", f"{m['host_ms']:.3f}",
                          f"{m['step_ms']:.2f}", f"{m['device_busy']:.1%}"])
    lines.append(markdown_table(["seqs", "device ms / step", "scheduling", "host ms / step", "wall ms / step",
                                 "device busy"], busy_rows, align="rrlrrr"))
    return "\n".join(lines)
