"""lm-evaluation-harness against a live jaxpaged server: the `lm_eval` command line that works offline.

`lm_eval --model local-completions` scores loglikelihood tasks (multiple
choice, perplexity) with `echo=true, logprobs=1, max_tokens=1` requests and
runs `generate_until` tasks as plain completions. It tokenizes on the client:
with `tokenized_requests=True` it sends token ids, so the server scores exactly
the tokens the harness counted (`tokenizer=` is the checkpoint directory that
holds `tokenizer.json`, or a GGUF file's tokenizer written out by
`tokenizer_dir`; the server has no `/tokenizer_info`, so the harness's
"remote" tokenizer is not used).
"""

from __future__ import annotations

import sys

import httpx


def served_model(base_url: str) -> tuple[str, int]:
    """The served model's name and `max_model_len`, from `GET /v1/models`."""
    data = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30).json()["data"][0]
    return data["id"], int(data["max_model_len"])


def tokenizer_dir(tokenizer: str, scratch: str) -> str:
    """A directory the harness loads with `AutoTokenizer`: `tokenizer` itself, or for a GGUF file its tokenizer
    written as `tokenizer.json` (and `tokenizer_config.json`) into `scratch`."""
    from pathlib import Path

    from jaxpaged.gguf_file import is_gguf_file

    if not is_gguf_file(tokenizer):
        return tokenizer
    from jaxpaged.checkpoint.convert import write_gguf_tokenizer_files
    write_gguf_tokenizer_files(Path(tokenizer), Path(scratch))
    return scratch


def lm_eval_command(base_url: str, tokenizer: str, tasks: list[str], *, model: str, max_length: int,
                    num_concurrent: int = 1, include_path: str | None = None, output_path: str | None = None,
                    limit: float | None = None, num_fewshot: int | None = None, log_samples: bool = False,
                    batch_size: int = 1) -> list[str]:
    """`python -m lm_eval --model local-completions ...` pointed at the server at `base_url`."""
    if not tasks:
        raise ValueError("tasks: at least one lm-eval task is needed")
    model_args = ",".join([
        f"model={model}", f"base_url={base_url.rstrip('/')}/v1/completions", f"tokenizer={tokenizer}",
        "tokenizer_backend=huggingface", "tokenized_requests=True", f"num_concurrent={num_concurrent}",
        "max_retries=1", f"max_length={max_length}"])
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
           "--tasks", ",".join(tasks), "--batch_size", str(batch_size)]
    if include_path:
        cmd += ["--include_path", include_path]
    if output_path:
        cmd += ["--output_path", output_path]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    if num_fewshot is not None:
        cmd += ["--num_fewshot", str(num_fewshot)]
    if log_samples:
        cmd.append("--log_samples")
    return cmd
