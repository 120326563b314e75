"""vLLM as a peer in `bench throughput` and `bench startup`: a vLLM install the user points at, in a subprocess.

vLLM's CPU build needs its own torch, so `VllmBackend` runs `vllm_worker.py` under that install's Python, on the
same checkpoint directory and token-id prompts, one timed pass per request, so that its passes alternate with
jaxpaged's. It gets every core, as jaxpaged has them (docs/benchmarks/cpu-performance.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from jaxpaged.bench.offline.backend_run import BackendRun, EngineLimits
from jaxpaged.bench.offline.vllm_worker import RESULT_MARK

WORKER = Path(__file__).with_name("vllm_worker.py")


def all_cores_binding() -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for every core this process may run on, e.g. "0-1"."""
    cores = sorted(os.sched_getaffinity(0))
    return ",".join(str(c) for c in cores) if cores != list(range(cores[0], cores[-1] + 1)) \
        else f"{cores[0]}-{cores[-1]}"


def checkpoint_dtype(checkpoint: str | Path) -> str:
    """The dtype a Hugging Face checkpoint's config.json names (`dtype` or `torch_dtype`), else "auto"."""
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    return config.get("dtype") or config.get("torch_dtype") or "auto"


class VllmBackend:
    """`vllm.LLM.generate` over the prompts in a subprocess: loaded and warmed up once, then measured per call."""

    name = "vllm"

    def __init__(self, python: str, checkpoint: str | Path, prompts: Sequence[Sequence[int]], *, output_len: int,
                 temperature: float = 0.0, seed: int = 0, limits: EngineLimits | None = None,
                 dtype: str | None = None, threads_bind: str | None = None, memory_fraction: float = 0.3,
                 env: Mapping[str, str] | None = None):
        """Start the worker under `python` (a vLLM install's interpreter) and wait until it has warmed up.

        `memory_fraction` is vLLM's `gpu_memory_utilization`, which on its CPU backend is the share
        of host memory it reserves (weights and KV cache); its default 0.92 fails on a shared host.
        `dtype` None means the checkpoint's own, named explicitly: vLLM's "auto" runs a float32
        checkpoint in 16-bit floats. `limits` None leaves block size, prefix caching and batch limits at
        vLLM's own defaults (its CPU attention takes only block sizes that are multiples of 32). `env` adds
        to the worker's environment.
        """
        if not Path(python).exists():
            raise ValueError(f"--vllm_python {python!r} does not exist: point it at the Python of a vLLM install")
        self.prompts = [list(p) for p in prompts]
        dtype = dtype or checkpoint_dtype(checkpoint)
        job = {"checkpoint": str(checkpoint), "prompts": self.prompts, "output_len": output_len,
               "temperature": temperature, "seed": seed, "dtype": dtype,
               "max_model_len": max(len(p) for p in prompts) + output_len, "memory_fraction": memory_fraction}
        if limits is not None:
            job["engine"] = {"block_size": limits.block_size, "enable_prefix_caching": limits.enable_prefix_caching,
                             "max_num_seqs": limits.max_num_seqs,
                             "max_num_batched_tokens": limits.max_num_batched_tokens}
        self._dir = tempfile.TemporaryDirectory(prefix="jaxpaged-vllm-")
        job_path = Path(self._dir.name) / "job.json"
        job_path.write_text(json.dumps(job))
        self._log = Path(self._dir.name) / "vllm.log"
        env = os.environ | {"VLLM_CPU_OMP_THREADS_BIND": threads_bind or all_cores_binding(),
                            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"} | dict(env or {})
        with open(self._log, "w") as log:
            self._proc = subprocess.Popen([python, str(WORKER), str(job_path)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        ready = self._next_result()
        self.load_s, self.warmup_s = ready["load_s"], ready["warmup_s"]

    def measure(self, output_len: int | None = None) -> BackendRun:
        """One timed `generate` pass over every prompt (`output_len` tokens each; None: the backend's), with vLLM's
        prefix cache emptied first."""
        self._proc.stdin.write("measure\n" if output_len is None else f"measure {output_len}\n")
        self._proc.stdin.flush()
        result = self._next_result()
        return BackendRun(self.name, result["token_ids"], result["elapsed_s"], self.warmup_s, self.load_s)

    def close(self) -> None:
        """End the worker (end of its input) and remove its files."""
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._dir.cleanup()

    def _next_result(self) -> dict:
        for line in self._proc.stdout:
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK):])
        log = self._log.read_text()
        self.close()
        # vLLM's engine core fails in its own process, and the worker's traceback that ends the log only says so:
        # the first exception line names the cause
        causes = [line for line in log.splitlines() if re.match(r"\w*(Error|Exception)\b.*:", line)]
        raise RuntimeError(f"the vLLM worker exited (code {self._proc.returncode}) before answering; "
                           f"first error: {causes[0] if causes else 'none logged'}; its log ends:\n{log[-2000:]}")
