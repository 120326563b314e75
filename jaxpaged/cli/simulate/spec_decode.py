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
    from jaxpaged.sim.speculation import project_workloads
    o = COMMAND.options()
    taus = {name: float(tau) for name, _, tau in (item.partition(":") for item in o.acceptance_lengths)}
    COMMAND.out.write(*project_workloads(COMMAND.engine_value("model"), o.profile, taus, list(o.batch_sizes),
                                         context=o.context, k=o.num_speculative_tokens))
