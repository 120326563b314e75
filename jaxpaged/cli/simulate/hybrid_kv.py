"""Simulated serving of a sliding-window model: the hybrid KV cache manager vs every layer as full attention.

    jaxpaged simulate hybrid-kv --model=gemma-3-27b --profile=h200-141gb --context_lens=8192,32768

For each context, `--num_requests` requests (prompt = context - max_tokens,
all arriving at once, no shared prefixes) are served twice in simulated time on
the same deployment: with the model's windows (the engine picks the hybrid
manager: KV cache groups, sliding groups dropping blocks) and with the windows
removed (one group of every layer, today's layout). Reports the pool, the most
sequences running at once, and simulated throughput.
"""

from __future__ import annotations

from absl import app

from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.sim.hybrid_kv import compare_layouts, layouts_table

FLAGS = FlagSet()
MODEL = EngineFlags(FLAGS, ["model"], defaults={"model": "gemma-3-27b"}).holders["model"]  # with sliding windows
PROFILE = FLAGS.DEFINE_string("profile", "h200-141gb", "device profile")
CONTEXT_LENS = FLAGS.DEFINE_list("context_lens", ["8192", "32768"], "tokens per sequence (prompt + output)")
NUM_REQUESTS = FLAGS.DEFINE_integer("num_requests", 0, "requests per run (0: 1.5 x what the hybrid pool holds)")
MAX_TOKENS = FLAGS.DEFINE_integer("max_tokens", 1024, "tokens generated per request (long enough that memory, "
                                  "not the prefill rate, bounds how many run at once)")
OUT = OutputFlags(FLAGS)
FLAGS.positive("max_tokens")


def main(argv):
    """Both layouts at every context; a Markdown table."""
    del argv
    try:
        rows = compare_layouts(MODEL.value, PROFILE.value, [int(n) for n in CONTEXT_LENS.value],
                               num_requests=NUM_REQUESTS.value, max_tokens=MAX_TOKENS.value)
    except ValueError as err:  # a model without sliding windows
        raise app.UsageError(str(err)) from err
    OUT.write({"rows": rows}, layouts_table(rows))
