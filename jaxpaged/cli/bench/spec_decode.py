"""N-gram speculative decoding on vs off, side by side in one run, on the pretrained SmolLM2 by default.

    jaxpaged bench spec-decode --batch_sizes=1,8,64 --output_len=64 --repeats=2 \\
        --json_out=out/spec_decode.json --md_out=out/spec_decode.md

Two workloads of chat prompts rendered with the model's chat template: a
repetition-heavy one (copy a paragraph with one word changed, rename a
variable in a function) and plain chat questions. Modes: `off`, `on` (n-gram,
speculating at every batch size) and `default` (n-gram with the default
`disable_by_batch_size`), all on the overlapped step (async scheduling, the
default). Greedy, EOS ignored, `--output_len` tokens each; the modes' tokens
are checked equal. See `jaxpaged.bench.offline.spec_decode`.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.offline.spec_decode import (chat_messages, repetition_messages, run_spec_decode_bench,
                                                spec_decode_table)
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags
from jaxpaged.pretrained import default_model_path
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


COMMAND = CommandFlags(SpecDecodeOptions, engine=["model", "num_blocks", "max_num_batched_tokens", "compile_cache_dir"],
                       engine_defaults={"model": str(default_model_path()), "num_blocks": 2048})
FLAGS = COMMAND.flags


def main(argv):
    """Build the three engines, run both workloads at every batch size, print and write the table."""
    del argv
    from jaxpaged.engine import Engine, EngineConfig
    from jaxpaged.server.chat import ChatTemplate

    o, k = COMMAND.options(), COMMAND.options().num_speculative_tokens
    base = EngineConfig(**COMMAND.engine.kwargs(), max_num_seqs=max(o.batch_sizes))  # overlapped steps, as served
    on = SpeculativeConfig(num_speculative_tokens=k, disable_by_batch_size=None)
    engines = {"off": Engine(base), "on": Engine(dataclasses.replace(base, speculative_config=on)),
               "default": Engine(dataclasses.replace(
                   base, speculative_config=SpeculativeConfig(num_speculative_tokens=k)))}
    template, tokenizer = ChatTemplate.for_model(base.model), engines["off"].tokenizer
    encode = lambda messages: tokenizer.encode(template.render(messages), add_special_tokens=False)  # noqa: E731
    messages = {"repetition": repetition_messages, "chat": chat_messages}
    workloads = {name: [encode(m) for m in messages[name]()] for name in o.workloads}
    rows = run_spec_decode_bench(engines, workloads, list(o.batch_sizes), output_len=o.output_len,
                                 repeats=o.repeats, on_row=lambda row: print(spec_decode_table([row])))
    COMMAND.out.write({"default_disable_by_batch_size": SpeculativeConfig().disable_by_batch_size,
                       "rows": [dataclasses.asdict(r) for r in rows]}, spec_decode_table(rows))
