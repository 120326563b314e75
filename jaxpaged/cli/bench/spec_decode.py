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
import platform

from jaxpaged.bench.offline.spec_decode import (chat_messages, repetition_messages, run_spec_decode_bench,
                                                spec_decode_table)
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.pretrained import default_model_path
from jaxpaged.spec_decode.config import SpeculativeConfig

FLAGS = FlagSet()
ENGINE = EngineFlags(FLAGS, ["model", "num_blocks", "max_num_batched_tokens", "compile_cache_dir"],
                     defaults={"model": str(default_model_path()), "num_blocks": 2048})
WORKLOADS = FLAGS.DEFINE_list("workloads", ["repetition", "chat"], "which workloads to run, in this order")
BATCH_SIZES = FLAGS.DEFINE_list("batch_sizes", ["1", "8", "64"], "requests in flight at once")
OUTPUT_LEN = FLAGS.DEFINE_integer("output_len", 64, "tokens generated per request (EOS ignored)")
REPEATS = FLAGS.DEFINE_integer("repeats", 2, "timed rounds per mode, alternating off / on / default")
NUM_SPEC = FLAGS.DEFINE_integer("num_speculative_tokens", 4, "k: draft tokens per sequence and step")
OUT = OutputFlags(FLAGS)
FLAGS.positive("output_len", "repeats", "num_speculative_tokens")
FLAGS.list_of("batch_sizes", integer_at_least=1)
FLAGS.list_of("workloads", choices=["repetition", "chat"])


def main(argv):
    """Build the three engines, run both workloads at every batch size, print and write the table."""
    del argv
    from jaxpaged.engine import Engine, EngineConfig
    from jaxpaged.server.chat import ChatTemplate

    batch_sizes = [int(b) for b in BATCH_SIZES.value]
    base = EngineConfig(**ENGINE.kwargs(), max_num_seqs=max(batch_sizes))  # overlapped steps, as served
    on = SpeculativeConfig(num_speculative_tokens=NUM_SPEC.value, disable_by_batch_size=None)
    engines = {"off": Engine(base), "on": Engine(dataclasses.replace(base, speculative_config=on)),
               "default": Engine(dataclasses.replace(
                   base, speculative_config=SpeculativeConfig(num_speculative_tokens=NUM_SPEC.value)))}
    template, tokenizer = ChatTemplate.for_model(base.model), engines["off"].tokenizer
    encode = lambda messages: tokenizer.encode(template.render(messages), add_special_tokens=False)  # noqa: E731
    messages = {"repetition": repetition_messages, "chat": chat_messages}
    workloads = {name: [encode(m) for m in messages[name]()] for name in WORKLOADS.value}
    rows = run_spec_decode_bench(engines, workloads, batch_sizes, output_len=OUTPUT_LEN.value,
                                 repeats=REPEATS.value, on_row=lambda row: print(spec_decode_table([row])))
    OUT.write({"model": base.model, "machine": platform.processor() or platform.machine(),
               "num_speculative_tokens": NUM_SPEC.value, "output_len": OUTPUT_LEN.value, "repeats": REPEATS.value,
               "default_disable_by_batch_size": SpeculativeConfig().disable_by_batch_size,
               "rows": [dataclasses.asdict(r) for r in rows]}, spec_decode_table(rows))
