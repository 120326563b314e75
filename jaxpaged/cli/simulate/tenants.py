"""Two tenants under overload, one at 10x the other's rate: each one's TTFT and TPOT under each scheduling policy.

    jaxpaged simulate tenants --model=llama3-8b --profile=h200-141gb
    jaxpaged simulate tenants --cpu_model=tiny --prompt_len=64 --output_len=16   # real CPU steps

The runs and the table are `jaxpaged.sim.tenants`; see docs/benchmarks/tenants.md.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.options import option
from jaxpaged.cli.deployment_flags import DeploymentFlags
from jaxpaged.cli.options import CommandFlags
from jaxpaged.sim.tenants import TenantLoad, run_tenants, tenants_table


@dataclasses.dataclass(frozen=True)
class TenantsOptions:
    """The two tenants' traffic (a `TenantLoad`), or a real run on this CPU."""

    light_rate: float = option(2.0, "the light tenant's requests/s", at_least=1e-6)
    heavy_factor: float = option(10.0, "the heavy tenant's rate over the light one's", at_least=0)
    duration_s: float = option(60.0, "simulated seconds of arrivals", at_least=1e-6)
    prompt_len: int = option(1024, "prompt tokens", at_least=1)
    output_len: int = option(128, "generated tokens", at_least=1)
    cpu_model: str | None = option(None, "run on this machine's CPU with this model (e.g. tiny) in real time, "
                                         "instead of the simulated device")


COMMAND = CommandFlags(TenantsOptions)
FLAGS = COMMAND.flags
DEPLOY = DeploymentFlags(FLAGS, ["model", "max_num_seqs"], profile="h200-141gb")


def main(argv):
    """Each policy on the same arrivals; print and write the table."""
    del argv
    o, deployment = COMMAND.options(), DEPLOY.deployment()
    load = TenantLoad(o.light_rate, o.heavy_factor, o.duration_s, o.prompt_len, o.output_len)
    rows = run_tenants(deployment, load, cpu_model=o.cpu_model)
    where = f"{o.cpu_model} on this CPU" if o.cpu_model else f"{deployment.model} on {deployment.profile}"
    print(f"{where}; light {load.light_rate}/s, heavy {load.light_rate * load.heavy_factor}/s,"
          f" {load.prompt_len}+{load.output_len} tokens, {load.duration_s:.0f} s of arrivals\n")
    COMMAND.out.write({"results": rows}, tenants_table(rows))
