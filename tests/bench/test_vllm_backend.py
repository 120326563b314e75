"""The vLLM backend's worker protocol, with a stand-in interpreter (the test venv has no vLLM)."""

import json
import stat

import pytest

from jaxpaged.bench.offline.backend_run import EngineLimits
from jaxpaged.bench.offline.vllm_backend import VllmBackend, checkpoint_dtype
from jaxpaged.bench.offline.vllm_worker import RESULT_MARK, llm_kwargs


def _fake_python(tmp_path, script: str):
    """An executable that stands in for a vLLM install's Python: runs `script` whatever it is given."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def _checkpoint(tmp_path, dtype="float32"):
    (tmp_path / "config.json").write_text(f'{{"dtype": "{dtype}"}}')
    return tmp_path


def test_a_worker_that_dies_names_the_first_error_of_its_log(tmp_path):
    python = _fake_python(tmp_path, 'echo "Traceback (most recent call last):" >&2\n'
                                    'echo "ValueError: 7.0 GiB of KV cache requested, 2.1 GiB free" >&2\n'
                                    'for i in $(seq 200); do echo "  padding line $i of a long traceback" >&2; done\n'
                                    'echo "RuntimeError: Engine core initialization failed." >&2\nexit 1\n')
    with pytest.raises(RuntimeError) as failed:
        VllmBackend(python, _checkpoint(tmp_path), [[1, 2, 3]], output_len=2)
    message = str(failed.value)
    assert "exited (code 1)" in message
    assert "first error: ValueError: 7.0 GiB of KV cache requested, 2.1 GiB free" in message
    assert message.rstrip().endswith("Engine core initialization failed.")


def test_a_missing_interpreter_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="--vllm_python"):
        VllmBackend(str(tmp_path / "nope"), _checkpoint(tmp_path), [[1]], output_len=1)


def test_the_checkpoint_names_its_dtype(tmp_path):
    assert checkpoint_dtype(_checkpoint(tmp_path, "bfloat16")) == "bfloat16"
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_dtype(tmp_path) == "auto"


def _job_of(tmp_path, **backend_kwargs) -> dict:
    """The job file a VllmBackend hands its worker (a stand-in that answers ready)."""
    python = _fake_python(tmp_path, f"cp $2 {tmp_path}/job-seen.json\n"
                                    f"echo '{RESULT_MARK}{{\"ready\": true, \"load_s\": 1, \"warmup_s\": 1}}'\n"
                                    "cat > /dev/null\n")
    VllmBackend(python, _checkpoint(tmp_path), [[1, 2, 3]], output_len=2, **backend_kwargs).close()
    return json.loads((tmp_path / "job-seen.json").read_text())


def test_engine_limits_reach_vllm_only_when_given(tmp_path):
    limits = EngineLimits(block_size=32, max_num_seqs=8, max_num_batched_tokens=512, enable_prefix_caching=False)
    given = llm_kwargs(_job_of(tmp_path, limits=limits))
    assert (given["block_size"], given["max_num_seqs"], given["max_num_batched_tokens"],
            given["enable_prefix_caching"]) == (32, 8, 512, False)
    defaults = llm_kwargs(_job_of(tmp_path))
    assert not {"block_size", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching"} & set(defaults)
    assert (defaults["max_model_len"], defaults["dtype"]) == (5, "float32")


def test_a_measure_line_may_name_the_output_length(tmp_path):
    """`measure(output_len=1)` (the first-token pass) asks the worker for `measure 1`; plain `measure` for its own."""
    answer = (f"printf '{RESULT_MARK}{{\"elapsed_s\": 1.5, \"token_ids\": [[%s]]}}\\n' \"$line\"")
    python = _fake_python(tmp_path, f"echo '{RESULT_MARK}{{\"ready\": true, \"load_s\": 1, \"warmup_s\": 1}}'\n"
                                    "while read line; do n=${line#measure}; n=${n:-0}; line=$((n + 0)); "
                                    f"{answer}; done\n")
    backend = VllmBackend(python, _checkpoint(tmp_path), [[1, 2, 3]], output_len=2)
    try:
        assert backend.measure(output_len=1).token_ids == [[1]]
        assert backend.measure().token_ids == [[0]]  # no length named: the worker's own
    finally:
        backend.close()
