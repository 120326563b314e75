"""Record the batches a real engine runs on a workload, so their step times can be measured.

`RecordingRunner` wraps a real runner and keeps every batch the engine hands
it. Replaying those batches with `calibrate.measure_batches`, interleaved with
the calibration shapes, times validation and calibration side by side, so the
load on a shared machine drifts over both alike. Pool contents do not matter
to a step's time, so replays run on whatever the pool holds.
"""

from __future__ import annotations

from typing import Sequence

from jaxpaged.workloads import WorkloadRequest
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.runner import StepOutput
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.step_input import ScheduledSeq


class RecordingRunner:
    """Delegates to a real runner and records every batch it runs."""

    def __init__(self, runner):
        self.inner = runner
        self.config = runner.config
        self.batches: list[list[ScheduledSeq]] = []

    @property
    def num_compiles(self) -> int:
        return self.inner.num_compiles

    def run_batch(self, batch: Sequence[ScheduledSeq], *, num_top_logprobs: int = 0) -> StepOutput:
        """Record the batch, then run it."""
        self.batches.append(list(batch))
        return self.inner.run_batch(batch, num_top_logprobs=num_top_logprobs)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write copies run on the real pool (not recorded)."""
        self.inner.copy_blocks(pairs)


def serve_all_at_once(engine: Engine, requests: list[WorkloadRequest]) -> None:
    """Add every request at once (greedy, ignore_eos, fixed lengths) and step until all finish."""
    for r in requests:
        engine.add_request(r.request_id, {"prompt_token_ids": r.prompt_token_ids, "cache_salt": r.cache_salt},
                           SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def record_engine_batches(runner, engine_config: EngineConfig,
                          requests: list[WorkloadRequest]) -> list[list[ScheduledSeq]]:
    """The batches the real engine runs, step by step, serving `requests` all at once."""
    recorder = RecordingRunner(runner)
    serve_all_at_once(Engine(engine_config, runner=recorder), requests)
    return recorder.batches
