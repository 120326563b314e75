"""Run any lm-evaluation-harness task against a live jaxpaged server (needs the `eval` extra).

    jaxpaged serve --model=/path/to/checkpoint --port=8000 &
    jaxpaged lm-eval --base_url=http://127.0.0.1:8000 --tokenizer=/path/to/checkpoint \
        --tasks=hellaswag,arc_easy --limit=100 --output_path=out/lm_eval

The model name and `max_model_len` come from the server's `/v1/models`; the
tokenizer is the checkpoint directory's `tokenizer.json` (the harness tokenizes
and sends token ids), or a GGUF file's, written to a temporary directory
(`--tokenizer=data/models/SmolLM2-135M-Instruct.Q4_1.gguf`). The repository
ships a small local task on the pretrained model, run from the repository root:
`--include_path=data/eval --tasks=jaxpaged_real_mc,jaxpaged_real_gen`. `--include_path` adds a directory of local task YAMLs;
set HF_DATASETS_OFFLINE=1 for tasks whose data is local. Extra flags after
`--` go to lm_eval unchanged.
"""

import subprocess
import sys
import tempfile

import httpx
from absl import app

from jaxpaged.bench.online.eval_harness import lm_eval_command, served_model, tokenizer_dir
from jaxpaged.cli.flagset import FlagSet

FLAGS = FlagSet()
BASE_URL = FLAGS.DEFINE_string("base_url", "http://127.0.0.1:8000", "the server's address")
TOKENIZER = FLAGS.DEFINE_string("tokenizer", None, "directory with the served checkpoint's tokenizer.json, or the "
                                "served GGUF file (required)")
TASKS = FLAGS.DEFINE_list("tasks", None, "lm-eval task names (required)")
INCLUDE = FLAGS.DEFINE_string("include_path", None, "directory of extra task YAMLs")
OUTPUT = FLAGS.DEFINE_string("output_path", None, "where lm_eval writes its results JSON")
LIMIT = FLAGS.DEFINE_float("limit", None, "documents per task (a fraction if < 1)")
FEWSHOT = FLAGS.DEFINE_integer("num_fewshot", None, "few-shot examples per prompt")
CONCURRENT = FLAGS.DEFINE_integer("num_concurrent", 8, "requests in flight (they batch in the engine)")
LOG_SAMPLES = FLAGS.DEFINE_boolean("log_samples", False, "write every request and response too")
FLAGS.positive("num_concurrent")
FLAGS.non_negative("num_fewshot")
FLAGS.register_validator("limit", lambda v: v is None or v > 0, message="--limit must be > 0")


def main(argv):
    """Ask the server for its model and length, then run lm_eval against it; exit with lm_eval's status."""
    if not TOKENIZER.value or not TASKS.value:
        raise app.UsageError("--tokenizer and --tasks are required")
    try:
        model, max_len = served_model(BASE_URL.value)
    except httpx.HTTPError as err:
        sys.exit(f"no jaxpaged server answers at --base_url={BASE_URL.value}: {err}")
    with tempfile.TemporaryDirectory() as scratch:
        try:
            tokenizer = tokenizer_dir(TOKENIZER.value, scratch)
        except ValueError as error:
            raise app.UsageError(f"--tokenizer={TOKENIZER.value}: {error}") from None
        cmd = lm_eval_command(BASE_URL.value, tokenizer, TASKS.value, model=model, max_length=max_len,
                              num_concurrent=CONCURRENT.value, include_path=INCLUDE.value, output_path=OUTPUT.value,
                              limit=LIMIT.value, num_fewshot=FEWSHOT.value, log_samples=LOG_SAMPLES.value)
        sys.exit(subprocess.call(cmd + argv[1:]))
