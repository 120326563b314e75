"""Two tenants under overload, one at 10x the other's rate: each tenant's TTFT and TPOT under each scheduling policy.

    jaxpaged simulate tenants --model=llama3-8b --profile=h200-141gb
    jaxpaged simulate tenants --cpu_model=tiny --prompt_len=64 --output_len=16   # real CPU steps

The runs and the table are `jaxpaged.sim.tenants`.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.tenants import TenantLoad, run_tenants, tenants_table

FLAGS = FlagSet()
ENGINE = EngineFlags(FLAGS, ["model", "max_num_seqs"], defaults={"model": "llama3-8b", "max_num_seqs": 256})
PROFILE = FLAGS.DEFINE_string("profile", "h200-141gb", "simulated device")
LIGHT_RATE = FLAGS.DEFINE_float("light_rate", 2.0, "the light tenant's requests/s")
HEAVY_FACTOR = FLAGS.DEFINE_float("heavy_factor", 10.0, "the heavy tenant's rate over the light one's")
DURATION = FLAGS.DEFINE_float("duration_s", 60.0, "simulated seconds of arrivals")
PROMPT_LEN = FLAGS.DEFINE_integer("prompt_len", 1024, "prompt tokens")
OUTPUT_LEN = FLAGS.DEFINE_integer("output_len", 128, "generated tokens")
CPU_MODEL = FLAGS.DEFINE_string("cpu_model", None, "run on this machine's CPU with this model (e.g. tiny) in real "
                                "time, instead of the simulated device")
OUT = OutputFlags(FLAGS)

FLAGS.device_profile("profile")
FLAGS.positive("prompt_len", "output_len")
FLAGS.non_negative("heavy_factor")
FLAGS.at_least(1e-6, "light_rate", "duration_s")


def main(argv):
    """Each policy on the same arrivals; print and write the table."""
    del argv
    model, max_num_seqs = ENGINE.holders["model"].value, ENGINE.holders["max_num_seqs"].value
    deployment = Deployment(model=model, profile=PROFILE.value, max_num_seqs=max_num_seqs)
    load = TenantLoad(LIGHT_RATE.value, HEAVY_FACTOR.value, DURATION.value, PROMPT_LEN.value, OUTPUT_LEN.value)
    rows = run_tenants(deployment, load, cpu_model=CPU_MODEL.value)
    where = f"{CPU_MODEL.value} on this CPU" if CPU_MODEL.value else f"{model} on {PROFILE.value}"
    print(f"{where}; light {load.light_rate}/s, heavy {load.light_rate * load.heavy_factor}/s,"
          f" {load.prompt_len}+{load.output_len} tokens, {load.duration_s:.0f} s of arrivals\n")
    OUT.write({"load": dataclasses.asdict(load), "model": model, "profile": PROFILE.value, "results": rows},
              tenants_table(rows))
