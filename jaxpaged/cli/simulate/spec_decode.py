"""The cost model's projection of n-gram speculation: decode speedup by batch size at given acceptance lengths.

    jaxpaged simulate spec-decode --model=llama3-8b --profile=h200-141gb \\
        --acceptance_lengths=repetition:3.88,chat:1.5 --batch_sizes=1,8,32,64,128,256

Each `name:tau` is a mean acceptance length measured by `jaxpaged bench
spec-decode` (k = `--num_speculative_tokens`); see `jaxpaged.sim.speculation`.
"""

from __future__ import annotations

from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
MODEL = EngineFlags(FLAGS, ["model"], defaults={"model": "llama3-8b"}).holders["model"]
PROFILE = FLAGS.DEFINE_string("profile", "h200-141gb", "device profile")
TAUS = FLAGS.DEFINE_list("acceptance_lengths", ["repetition:3.88", "chat:1.5"], "workload:mean acceptance length")
BATCH_SIZES = FLAGS.DEFINE_list("batch_sizes", ["1", "8", "32", "64", "128", "256"], "sequences decoding at once")
CONTEXT = FLAGS.DEFINE_integer("context", 1024, "tokens of context per sequence")
NUM_SPEC = FLAGS.DEFINE_integer("num_speculative_tokens", 4, "k: drafts per sequence and step")
OUT = OutputFlags(FLAGS)
FLAGS.positive("context", "num_speculative_tokens")
FLAGS.list_of("batch_sizes", integer_at_least=1)
FLAGS.device_profile("profile")


def _taus_ok(items) -> bool:
    try:
        return all(name and float(tau) >= 1.0 for name, _, tau in (item.partition(":") for item in items))
    except ValueError:
        return False


FLAGS.register_validator("acceptance_lengths", _taus_ok, "each item must be name:tau with tau >= 1")


def main(argv):
    """Print and write the projection."""
    del argv
    import dataclasses

    from jaxpaged.config import load_config
    from jaxpaged.sim.cost_model import CostModel
    from jaxpaged.sim.profiles import get_profile
    from jaxpaged.sim.speculation import acceptance_rate, project_speedup, projection_table

    cost = CostModel(load_config(MODEL.value), get_profile(PROFILE.value))
    k, rows = NUM_SPEC.value, []
    for item in TAUS.value:
        name, _, tau = item.partition(":")
        points = project_speedup(cost, [int(b) for b in BATCH_SIZES.value], context=CONTEXT.value, k=k,
                                 tau=float(tau))
        rows += [(name, p) for p in points]
    OUT.write({"model": MODEL.value, "profile": PROFILE.value, "context": CONTEXT.value, "num_speculative_tokens": k,
               "acceptance_rates": {n: acceptance_rate(float(t), k) for n, _, t in (i.partition(":") for i in TAUS.value)},
               "rows": [{"workload": n, **dataclasses.asdict(p)} for n, p in rows]}, projection_table(rows))
