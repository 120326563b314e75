"""``jaxpaged bench spec-decode``: n-gram speculation on against off, on a repetition-heavy and a chat workload.

Each (workload, batch size) runs once per mode untimed (it compiles the step shapes; greedy tokens, so the
shapes are the same every run), then the modes alternate for `repeats` timed rounds so a machine whose load
drifts loads them alike; medians, and each ratio is a mode's median over off's. Every mode's tokens are
checked equal to off's. docs/benchmarks/spec-decode.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

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


# copy-a-paragraph-with-one-change and code-edit requests: the answer repeats most of the prompt
_PARAGRAPHS = (
    "The library opens at nine in the morning and closes at six in the evening on weekdays. On Saturdays it "
    "opens at ten and closes at four. Members may borrow up to eight books at a time for three weeks, and "
    "renew them twice online unless another member has reserved them.",
    "Our team met on Tuesday to plan the spring release. We agreed to freeze features on March first, to "
    "spend two weeks on testing, and to publish the release notes a day before the launch. Maria will "
    "coordinate the translations and Tom will update the website.",
    "To bake the bread, mix five hundred grams of flour with ten grams of salt and seven grams of yeast. "
    "Add three hundred and fifty millilitres of warm water, knead for ten minutes, and let the dough rise "
    "for an hour in a warm place before shaping it into a loaf.",
    "The museum's new wing houses paintings from the nineteenth century. Visitors enter through the garden "
    "courtyard, pass the sculpture hall, and reach the gallery on the second floor. Guided tours start "
    "every hour and last about forty minutes.",
)
_CHANGES = (("nine", "eight"), ("Tuesday", "Wednesday"), ("ten minutes", "twelve minutes"), ("second", "third"))
_CODE = (
    "def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n        subtotal += "
    "item.price * item.quantity\n    tax = subtotal * tax_rate\n    return subtotal + tax\n",
    "def count_words(text):\n    counts = {}\n    for word in text.split():\n        word = word.lower()\n"
    "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
)
_CODE_EDITS = (("subtotal", "net_total"), ("counts", "frequencies"))
_CHAT = (
    "What are three good habits for staying healthy while working from home?",
    "Explain in simple words why the sky is blue.",
    "Give me some ideas for a birthday party for a ten-year-old.",
    "How do I start learning to play the guitar?",
    "What should I pack for a weekend hiking trip?",
    "Why do cats purr?",
    "Suggest a simple recipe for dinner tonight.",
    "How can I improve my handwriting?",
)


def repetition_messages() -> list[list[dict]]:
    """Chat requests whose answer copies a paragraph (with one word changed) or a function (one rename)."""
    asks = [f"Copy the following paragraph exactly, but change \"{old}\" to \"{new}\":\n\n{text}"
            for text, (old, new) in zip(_PARAGRAPHS, _CHANGES)]
    asks += [f"Rename the variable `{old}` to `{new}` in this Python function and show the whole function:\n\n"
             f"```python\n{code}```" for code, (old, new) in zip(_CODE, _CODE_EDITS)]
    return [[{"role": "user", "content": ask}] for ask in asks]


def chat_messages() -> list[list[dict]]:
    """Plain chat questions: the answer has little to copy from the prompt."""
    return [[{"role": "user", "content": ask}] for ask in _CHAT]


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
    messages = {"repetition": repetition_messages, "chat": chat_messages}
    workloads = {name: [tokenizer.encode(template.render(m), add_special_tokens=False) for m in messages[name]()]
                 for name in options.workloads}
    rows = run_spec_decode_bench(engines, workloads, list(options.batch_sizes), output_len=options.output_len,
                                 repeats=options.repeats, on_row=lambda row: print(spec_decode_table([row])))
    return ({"default_disable_by_batch_size": SpeculativeConfig().disable_by_batch_size,
             "rows": [dataclasses.asdict(r) for r in rows]}, spec_decode_table(rows))
