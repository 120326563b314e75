"""Disaggregated prefill/decode measured: colocated vs one prefill + one decode process, and the transports.

    jaxpaged bench disagg --model=tiny --num_long=4 --long_prompt_len=1024 --repeats=20

Running decodes with long prompts arriving, against one ``jaxpaged serve`` and against a prefill and a decode
server behind ``jaxpaged proxy`` per transport (TTFT, TPOT per request class); then each transport's
per-request overhead and bandwidth between two processes. docs/benchmarks/disaggregation.md.
"""

from __future__ import annotations

from jaxpaged.bench.online.disagg import DisaggBenchOptions, DisaggWorkload, run_disagg
from jaxpaged.cli.options import CommandFlags
from jaxpaged.pretrained import default_model_path

COMMAND = CommandFlags(DisaggBenchOptions, DisaggWorkload, engine=["model", "max_model_len"],  # every engine's
                       engine_defaults={"model": str(default_model_path()), "max_model_len": 2048})
FLAGS = COMMAND.flags


def main(argv):
    """Run both parts, then print and write the tables."""
    del argv
    COMMAND.out.write(*run_disagg(COMMAND.options(), COMMAND.options(DisaggWorkload), COMMAND.engine_value("model"),
                                  COMMAND.engine_value("max_model_len")))
