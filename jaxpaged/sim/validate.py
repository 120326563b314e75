"""Record the batches a real engine runs on a workload, so their step times can be measured.

`RecordingRunner` wraps a runner and keeps every batch the engine hands it.
Replaying those batches with `calibrate.measure_batches`, interleaved with
the calibration shapes, times validation and calibration side by side, so the
load on a shared machine drifts over both alike. Pool contents do not matter
to a step's time, so replays run on whatever the pool holds.
"""

from __future__ import annotations

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.runner import InputBatch, Runner, StepHandle
from jaxpaged.runner.step_input import ScheduledSeq
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler import TOKEN_ON_DEVICE, SchedulerOutput
from jaxpaged.runner.step_input import ScheduledSeq
from jaxpaged.sim.workloads import WorkloadRequest


class RecordingRunner:
    """Delegates to a runner and records every step it runs as a list of `ScheduledSeq`.

    It keeps its own persistent batch (the same `InputBatch` a `ModelRunner`
    keeps) to know each sequence's block table at every step.
    """

    def __init__(self, runner: Runner):
        self.inner = runner
        self.config = runner.config
        self.block_size = runner.block_size
        self.num_blocks = runner.num_blocks
        self.capabilities = runner.capabilities.of_steps()
        self.batches: list[list[ScheduledSeq]] = []
        self._rows = InputBatch(runner.block_size)

    @property
    def num_compiles(self) -> int:
        return self.inner.num_compiles

    def reset(self) -> None:
        """Reset the wrapped runner's rows and this recorder's copy of them."""
        self.inner.reset()
        self._rows = InputBatch(self.block_size)

    def execute_model(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Record the step, then run it."""
        self._rows.apply(scheduler_output)
        if scheduler_output.seqs:
            self.batches.append(self._batch(scheduler_output))
        return self.inner.execute_model(scheduler_output)

    def _batch(self, out: SchedulerOutput) -> list[ScheduledSeq]:
        batch, at = [], 0
        for seq_id, start, n in zip(out.seq_ids, out.starts, out.num_tokens):
            tokens = [0 if t == TOKEN_ON_DEVICE else t for t in out.token_ids[at:at + n]]
            at += n
            batch.append(ScheduledSeq(tokens, start, self._rows.block_ids(seq_id, cdiv(start + n, self.block_size))))
        return batch


def serve_all_at_once(engine: Engine, requests: list[WorkloadRequest]) -> None:
    """Add every request at once (greedy, ignore_eos, fixed lengths) and step until all finish."""
    for r in requests:
        engine.add_request(r.request_id, {"prompt_token_ids": r.prompt_token_ids, "cache_salt": r.cache_salt},
                           SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True,
                                          output_kind=RequestOutputKind.FINAL_ONLY))
    while engine.has_unfinished_requests():
        engine.step()


def record_engine_batches(runner, engine_config: EngineConfig,
                          requests: list[WorkloadRequest]) -> list[list[ScheduledSeq]]:
    """The batches the real engine runs, step by step, serving `requests` all at once."""
    recorder = RecordingRunner(runner)
    serve_all_at_once(Engine(engine_config, runner=recorder), requests)
    return recorder.batches
