"""`bench startup --vllm_python`: vLLM's first generate runs the worker on the jaxpaged child's prompts and caches.

A fake interpreter stands in for a vLLM install: it records the job and the
environment it was given and answers as `vllm_worker.py` does when ready.
"""

import json
import stat

import numpy as np

from jaxpaged.bench.offline.startup import StartupCase, vllm_first_generate
from jaxpaged.bench.offline.vllm_worker import RESULT_MARK


def test_vllm_first_generate_passes_the_prompts_and_the_cache_dir(tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"vocab_size": 1000, "torch_dtype": "float32"}))
    record = tmp_path / "record.json"
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n"  # $1 is the worker script, $2 its job file
                    f"printf '{{\"job\": %s, \"cache\": \"%s\", \"inductor\": \"%s\"}}' \"$(cat $2)\" "
                    f"\"$VLLM_CACHE_ROOT\" \"$TORCHINDUCTOR_CACHE_DIR\" > {record}\n"
                    f"echo '{RESULT_MARK}{{\"ready\": true, \"load_s\": 2.0, \"warmup_s\": 3.0}}'\n"
                    "cat > /dev/null\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    case = StartupCase(str(checkpoint), num_prompts=5, max_prompt_len=40, output_len=7)

    result = vllm_first_generate(str(fake), case, str(tmp_path / "cache"))

    seen = json.loads(record.read_text())
    assert (seen["cache"], seen["inductor"]) == (str(tmp_path / "cache"), str(tmp_path / "cache" / "inductor"))
    job = seen["job"]
    assert (job["dtype"], job["output_len"], len(job["prompts"])) == ("float32", 7, 5)
    assert "engine" not in job  # vLLM's own block size and batch limits: its CPU attention refuses block size 16
    rng = np.random.default_rng(0)  # the draws of the jaxpaged child (`_GENERATE_CHILD`): ids below 250
    assert job["prompts"] == [rng.integers(0, 250, int(rng.integers(16, 41))).tolist() for _ in range(5)]
    assert (result["build_s"], result["generate_s"]) == (2.0, 3.0)
    assert abs(result["import_s"] - (result["total_s"] - 5.0)) < 1e-9
