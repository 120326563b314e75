"""The cost of penalties + logit_bias on a decode step, and of prompt logprobs on a prefill, side by side.

    jaxpaged bench logit-controls --model=llama-100m --decode_batch=32 --decode_context=512 \
        --prefill_len=512 --repeats=10 --json_out=out/logit_controls.json --md_out=out/logit_controls.md
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.offline.logit_controls import compare_logit_controls
from jaxpaged.bench.offline.step_timing import StepShape
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class LogitControlsOptions(StepShape):
    """The two steps (every decode row penalised, every prefill position with prompt logprobs) and the rounds."""

    prompt_top_logprobs: int = option(5, "top ids per prompt position in the third variant", at_least=1)
    repeats: int = option(10, "alternating rounds (medians reported)", at_least=1)


COMMAND = CommandFlags(LogitControlsOptions, engine=["model", "block_size"], engine_defaults={"model": "llama-100m"})
FLAGS = COMMAND.flags
FLAGS.at_least(2, "prefill_len")  # a prompt logprob needs a next token


def main(argv):
    """Time each variant side by side; print and write the table."""
    del argv
    options = COMMAND.options()
    COMMAND.out.write(*compare_logit_controls(model_config(COMMAND.engine_value("model")), options,
                                              top_k=options.prompt_top_logprobs,
                                              block_size=COMMAND.engine_value("block_size"), repeats=options.repeats))
