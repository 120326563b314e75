"""Run any lm-evaluation-harness task against a live jaxpaged server (needs the `eval` extra).

    jaxpaged serve --model=/path/to/checkpoint --port=8000 &
    jaxpaged lm-eval --base_url=http://127.0.0.1:8000 --tokenizer=/path/to/checkpoint \\
        --tasks=hellaswag,arc_easy --limit=100 --output_path=out/lm_eval

`lm_eval --model local-completions` with ``tokenized_requests=True``: the harness tokenizes with
--tokenizer's ``tokenizer.json`` (a GGUF file's is written to a temporary directory) and sends token ids;
the model name and ``max_model_len`` come from the server's ``/v1/models``. The repository's local task:
``--include_path=data/eval --tasks=jaxpaged_real_mc,jaxpaged_real_gen`` (set HF_DATASETS_OFFLINE=1 for local
data). Flags after ``--`` go to lm_eval unchanged. docs/real-model.md, "lm-eval on the pretrained model".
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from absl import app

from jaxpaged.cli.flagset import FlagSet
from jaxpaged.gguf_file import is_gguf_file

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
    base_url = BASE_URL.value.rstrip("/")
    try:
        served = httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]
    except httpx.HTTPError as err:
        sys.exit(f"no jaxpaged server answers at --base_url={BASE_URL.value}: {err}")
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = TOKENIZER.value  # a directory the harness loads with AutoTokenizer
        if is_gguf_file(tokenizer):  # its tokenizer written as tokenizer.json (and tokenizer_config.json)
            from jaxpaged.checkpoint.convert import write_gguf_tokenizer_files
            try:
                write_gguf_tokenizer_files(Path(tokenizer), Path(scratch))
            except ValueError as error:
                raise app.UsageError(f"--tokenizer={tokenizer}: {error}") from None
            tokenizer = scratch
        model_args = ",".join([
            f"model={served['id']}", f"base_url={base_url}/v1/completions", f"tokenizer={tokenizer}",
            "tokenizer_backend=huggingface", "tokenized_requests=True", f"num_concurrent={CONCURRENT.value}",
            "max_retries=1", f"max_length={int(served['max_model_len'])}"])
        cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
               "--tasks", ",".join(TASKS.value), "--batch_size", "1"]
        for flag, value in (("--include_path", INCLUDE.value), ("--output_path", OUTPUT.value),
                            ("--limit", LIMIT.value), ("--num_fewshot", FEWSHOT.value)):
            if value not in (None, ""):
                cmd += [flag, str(value)]
        sys.exit(subprocess.call(cmd + ["--log_samples"] * LOG_SAMPLES.value + argv[1:]))
