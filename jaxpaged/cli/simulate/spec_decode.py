"""The cost model's projection of n-gram speculation: decode speedup by batch size at given acceptance lengths.

    jaxpaged simulate spec-decode --model=llama3-8b --profile=h200-141gb \\
        --acceptance_lengths=repetition:3.88,chat:1.5 --batch_sizes=1,8,32,64,128,256

Each `name:tau` is a mean acceptance length measured by `jaxpaged bench
spec-decode` (k = `--num_speculative_tokens`); see `jaxpaged.sim.speculation`.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class SpecDecodeProjection:
    """The device, each workload's mean acceptance length, the batch sizes, the context and k."""

    profile: str = option("h200-141gb", "device profile", check="device_profile")
    acceptance_lengths: tuple[str, ...] = option(("repetition:3.88", "chat:1.5"), "workload:mean acceptance length")
    batch_sizes: tuple[int, ...] = option((1, 8, 32, 64, 128, 256), "sequences decoding at once", at_least=1)
    context: int = option(1024, "tokens of context per sequence", at_least=1)
    num_speculative_tokens: int = option(4, "k: drafts per sequence and step", at_least=1)


COMMAND = CommandFlags(SpecDecodeProjection, engine=["model"], engine_defaults={"model": "llama3-8b"})
FLAGS = COMMAND.flags


def _taus_ok(items) -> bool:
    try:
        return all(name and float(tau) >= 1.0 for name, _, tau in (item.partition(":") for item in items))
    except ValueError:
        return False


FLAGS.register_validator("acceptance_lengths", _taus_ok, "each item must be name:tau with tau >= 1")


def main(argv):
    """Print and write the projection."""
    del argv
    from jaxpaged.config import load_config
    from jaxpaged.sim.cost_model import CostModel
    from jaxpaged.sim.profiles import get_profile
    from jaxpaged.sim.speculation import acceptance_rate, project_speedup, projection_table

    o, model = COMMAND.options(), COMMAND.engine_value("model")
    cost = CostModel(load_config(model), get_profile(o.profile))
    k, rows = o.num_speculative_tokens, []
    taus = {name: float(tau) for name, _, tau in (item.partition(":") for item in o.acceptance_lengths)}
    for name, tau in taus.items():
        rows += [(name, p) for p in project_speedup(cost, list(o.batch_sizes), context=o.context, k=k, tau=tau)]
    COMMAND.out.write({"acceptance_rates": {n: acceptance_rate(t, k) for n, t in taus.items()},
                       "rows": [{"workload": n, **dataclasses.asdict(p)} for n, p in rows]}, projection_table(rows))
