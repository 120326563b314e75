"""``jaxpaged bench spec-decode``: n-gram speculation on against off, on a repetition-heavy and a chat workload.

Each (workload, batch size) runs once per mode untimed (it compiles the step shapes; greedy tokens, so the
shapes are the same every run), then the modes alternate for `repeats` timed rounds so a machine whose load
drifts loads them alike; medians, and each ratio is a mode's median over off's. Every mode's tokens are
checked equal to off's. docs/benchmarks/spec-decode.md.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from jaxpaged.bench.offline.driver import median_summary, run_workload, summarize
from jaxpaged.bench.offline.timing import alternate
from jaxpaged.bench.options import option
from jaxpaged.report import markdown_table
from jaxpaged.sim.workloads import WorkloadRequest
from jaxpaged.spec_decode.config import SpeculativeConfig

@dataclasses.dataclass(frozen=True)
class SpecDecodeOptions:
    """The workloads and batch sizes, the requests' length, the rounds, and k."""

    workloads: tuple[str, ...] = option(("repetition", "chat"), "which workloads to run, in this order",
                                        choices=["repetition", "chat"])
    batch_sizes: tuple[int, ...] = option((1, 8, 64), "requests in flight at once", at_least=1)
    output_len: int = option(64, "tokens generated per request (EOS ignored)", at_least=1)
    repeats: int = option(2, "timed rounds per mode, alternating off / on / default", at_least=1)
    num_speculative_tokens: int = option(4, "k: draft tokens per sequence and step", at_least=1)


PROMPTS = Path(__file__).resolve().parents[3] / "data" / "spec_decode" / "prompts.jsonl"


def workload_messages(name: str) -> list[list[dict]]:
    """The chat conversations of workload ``name`` in data/spec_decode/prompts.jsonl: "repetition" (the answer
    copies a paragraph with one word changed, or a function with one variable renamed) or "chat" (plain
    questions: the answer has little to copy from the prompt)."""
    records = (json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip())
    return [record["messages"] for record in records if record["workload"] == name]


def workload(prompts: Sequence[list[int]], batch_size: int, output_len: int, name: str) -> list[WorkloadRequest]:
    """`batch_size` requests at time 0, cycling through `prompts`."""
    return [WorkloadRequest(f"{name}-{i}", list(prompts[i % len(prompts)]), output_len) for i in range(batch_size)]


@dataclasses.dataclass
class SpecDecodeRow:
    """One (workload, batch size): the median summary per mode and the ratios on/off."""

    workload: str
    batch_size: int
    summaries: dict[str, dict[str, float]]

    def ratio(self, metric: str, mode: str = "on") -> float:
        """`metric` with `mode` over `metric` with speculation off."""
        return self.summaries[mode][metric] / self.summaries["off"][metric]


def run_spec_decode_bench(engines: Mapping[str, object], workloads: Mapping[str, Sequence[list[int]]],
                          batch_sizes: Sequence[int], *, output_len: int, repeats: int,
                          on_row: Callable[[SpecDecodeRow], None] | None = None) -> list[SpecDecodeRow]:
    """Every workload at every batch size through every engine (`engines["off"]` is the baseline).

    Raises RuntimeError if a mode's greedy tokens differ from the baseline's.
    """
    rows = []
    for name, prompts in workloads.items():
        for batch_size in batch_sizes:
            requests = workload(prompts, batch_size, output_len, name)
            tokens = {}
            for mode, engine in engines.items():  # untimed: compiles this batch's step shapes
                engine.reset_prefix_cache()
                record = run_workload(engine, requests)
                tokens[mode] = {o.request_id: o.outputs[0].token_ids for o in record.outputs}
            for mode in engines:
                if tokens[mode] != tokens["off"]:
                    raise RuntimeError(f"{name} at batch {batch_size}: mode {mode}'s greedy tokens differ from off's")
            runs = alternate({mode: lambda e=engine: _measured_run(e, requests) for mode, engine in engines.items()},
                             repeats)
            row = SpecDecodeRow(name, batch_size, {mode: median_summary(r) for mode, r in runs.items()})
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def _measured_run(engine, requests: Sequence[WorkloadRequest]) -> dict:
    """One timed pass on an emptied prefix cache, with this pass's own acceptance (the engine keeps totals)."""
    engine.reset_prefix_cache()
    drafts, accepted = engine.stats.spec_num_drafts, engine.stats.spec_num_accepted_tokens
    record = run_workload(engine, requests)
    record.spec_num_drafts -= drafts
    record.spec_num_accepted_tokens -= accepted
    return summarize(record)


def spec_decode_table(rows: Sequence[SpecDecodeRow]) -> str:
    """One line per (workload, batch size, mode): tok/s, TPOT p50/p99, acceptance length, speedup over off."""
    lines = []
    for row in rows:
        for mode, s in row.summaries.items():
            lines.append([row.workload, row.batch_size, mode, f"{s['output_token_throughput']:.1f}",
                          f"{s['tpot_p50_ms']:.1f}", f"{s['tpot_p99_ms']:.1f}",
                          f"{s['spec_decode_mean_acceptance_length']:.2f}",
                          f"{row.ratio('output_token_throughput', mode):.2f}x"])
    return markdown_table(["workload", "batch", "mode", "output tok/s", "TPOT p50 ms", "TPOT p99 ms",
                           "mean acceptance length", "tok/s vs off"], lines, align="llrrrrrr")


def spec_decode_report(options: SpecDecodeOptions, engine_kwargs: dict) -> tuple[dict, str]:
    """Both workloads, in the model's chat template, at every batch size through three engines of
    ``engine_kwargs`` (off; on: n-gram at every batch size; default: n-gram with the default
    `disable_by_batch_size`), on the overlapped step as served; each row printed as it finishes: the result and
    its table."""
    from jaxpaged.engine import Engine, EngineConfig
    from jaxpaged.server.chat import ChatTemplate

    k = options.num_speculative_tokens
    base = EngineConfig(**engine_kwargs, max_num_seqs=max(options.batch_sizes))
    engines = {mode: Engine(dataclasses.replace(base, speculative_config=speculative)) for mode, speculative in (
        ("off", None), ("on", SpeculativeConfig(num_speculative_tokens=k, disable_by_batch_size=None)),
        ("default", SpeculativeConfig(num_speculative_tokens=k)))}
    template, tokenizer = ChatTemplate.for_model(base.model), engines["off"].tokenizer
    workloads = {name: [tokenizer.encode(template.render(m), add_special_tokens=False)
                        for m in workload_messages(name)] for name in options.workloads}
    rows = run_spec_decode_bench(engines, workloads, list(options.batch_sizes), output_len=options.output_len,
                                 repeats=options.repeats, on_row=lambda row: print(spec_decode_table([row])))
    return ({"default_disable_by_batch_size": SpeculativeConfig().disable_by_batch_size,
             "rows": [dataclasses.asdict(r) for r in rows]}, spec_decode_table(rows))
