"""A runner that stands in for an asynchronous device in real time: each step sleeps its predicted time.

`SleepingDeviceRunner` keeps the real persistent batch and lays out every step
with the real code (`InputBatch`), predicts the step's time with the cost model
of a device profile, and queues the step on a device that is modelled as a
FIFO of deadlines, as an asynchronous GPU's stream: a step starts when it is
dispatched or when the step before it ends, whichever is later, and takes its
predicted time; reading its tokens sleeps until it ends and returns the fixed
token. No thread runs the "device", so, as with a GPU, nothing on the device
side takes the GIL or a core from the host: the engine's host work
(scheduling, layout, output processing) runs for real beside it, and the
share of wall time the device is busy shows whether the host keeps such a
device fed. The CPU stays free while the "device" runs.

It serves two uses: the host-overhead benchmark (`jaxpaged.bench.offline.host_overhead`)
and `jaxpaged serve --device=simulated`, which runs the whole server over it
(`jaxpaged.sim.realtime`).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import numpy as np

from jaxpaged.runner import InputBatch
from jaxpaged.runner.protocol import RunnerCapabilities
from jaxpaged.runner.step_input import StepInput
from jaxpaged.scheduler import ModelOutput, SchedulerOutput
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.runner import fixed_token

MAX_BUSY_INTERVALS = 1 << 16  # (start, end) pairs kept for `busy_seconds`; a server keeps only the newest


class _Timer:
    """Adds up the wall time of calls to one function."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.total_s = 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.total_s += time.perf_counter() - start


class _PendingSleep:
    def __init__(self, runner: "SleepingDeviceRunner", end: float | None, num_seqs: int,
                 masks: tuple[list[int], np.ndarray | None] | None = None):
        self._runner, self._end, self._num_seqs = runner, end, num_seqs  # end: perf_counter deadline
        self._masks = masks  # (sequence indices, packed masks) of the constrained rows

    def sample(self, indices: list[int], bits: np.ndarray | None) -> None:
        """Token masks filled while the step "runs" (asynchronous scheduling with grammar rows)."""
        self._masks = (indices, bits)

    def result(self) -> ModelOutput:
        if self._end is not None:
            start = time.perf_counter()
            if self._end > start:
                time.sleep(self._end - start)
            self._runner.wait_s += time.perf_counter() - start
            self._end = None
        n = self._num_seqs
        tokens = np.full(n, self._runner.token, np.int32)
        if self._masks is not None and self._masks[0]:
            start = time.perf_counter()
            for i, row in zip(*self._masks):
                tokens[i] = self._runner.pick_allowed(row)
            self._runner.predict_s += time.perf_counter() - start  # the stand-in's own work, not the host's
        return ModelOutput(token_ids=tokens, logprobs=np.zeros(n, np.float32))


class SleepingDeviceRunner:
    """A runner whose device is a queue of deadlines, each step its predicted time (see the module docstring)."""

    num_compiles = 0
    # a fixed token: no prompt logprobs, no beam search; constrained rows draw a random allowed token
    # (structured output); `busy_s` and `wait_s` count the sleeping device's time
    capabilities = RunnerCapabilities(computes_logits=False, counts_device_time=True)

    def __init__(self, config, cost_model: CostModel, num_blocks: int, *, sleep: bool = True):
        self.config = config
        self.cost_model = cost_model
        self.block_size = cost_model.block_size
        self.num_blocks = num_blocks
        self.sleep = sleep
        self.token = fixed_token(config)
        self._rng = np.random.default_rng(0)
        self.avoid_tokens = {self.token}  # constrained rows draw these only when nothing else is allowed (EOS)
        self.input_batch = InputBatch(self.block_size)
        self.layout = _Timer(self.input_batch.prepare)
        self.device_s = 0.0  # predicted (slept) seconds of every dispatched step
        self.wait_s = 0.0  # host seconds spent waiting for the device
        self.predict_s = 0.0  # host seconds spent predicting step times (the stand-in's own cost)
        # (start, end) of the newest steps, perf_counter; busy_s adds up every one
        self.busy_intervals: collections.deque[tuple[float, float]] = collections.deque(maxlen=MAX_BUSY_INTERVALS)
        self.busy_s = 0.0
        self.num_steps = 0
        self._busy_lock = threading.Lock()  # busy_seconds may be read from another thread
        self._free_at = 0.0  # when the device finishes the last step queued on it

    def reset(self) -> None:
        """Forget every row of the persistent batch."""
        self.input_batch = InputBatch(self.block_size)
        self.layout = _Timer(self.input_batch.prepare)

    def execute_model(self, scheduler_output: SchedulerOutput) -> _PendingSleep:
        """Apply the changes, lay out the step (timed), and queue its predicted time on the device."""
        self.input_batch.apply(scheduler_output)
        if not scheduler_output.seqs:
            return _PendingSleep(self, None, 0)
        step = self.layout(scheduler_output)
        start = time.perf_counter()
        seconds = self.step_time(step)
        self.predict_s += time.perf_counter() - start
        self.device_s += seconds
        end = self._queue_step(seconds) if self.sleep else None
        masks = None
        if scheduler_output.token_mask_indices:
            masks = (scheduler_output.token_mask_indices, scheduler_output.token_masks)
        return _PendingSleep(self, end, scheduler_output.num_seqs, masks)

    def pick_allowed(self, row: np.ndarray) -> int:
        """A random token a packed mask row allows, other than `avoid_tokens` when another is allowed."""
        words = np.flatnonzero(row)
        for _ in range(4):
            word = int(words[self._rng.integers(len(words))])
            bits = np.flatnonzero((int(row[word]) & 0xFFFFFFFF) >> np.arange(32) & 1)
            token = word * 32 + int(bits[self._rng.integers(len(bits))])
            if token not in self.avoid_tokens:
                return token
        return token

    def _queue_step(self, seconds: float) -> float:
        """Put a step on the device: it starts once dispatched and the step before it has ended."""
        begin = max(time.perf_counter(), self._free_at)
        self._free_at = end = begin + seconds
        with self._busy_lock:
            self.busy_intervals.append((begin, end))
            self.busy_s += seconds
            self.num_steps += 1
        return end

    def busy_seconds(self, begin: float, end: float) -> float:
        """Seconds within `[begin, end]` during which the device was running a step."""
        with self._busy_lock:
            intervals = list(self.busy_intervals)
        return sum(max(0.0, min(b, end) - max(a, begin)) for a, b in intervals)

    def step_time(self, step: StepInput) -> float:
        """The cost model's time for the laid-out step (O(1) numpy for a decode-only step)."""
        real = step.query_lens > 0
        lens, context = step.query_lens[real], step.context_lens[real]
        if np.all(lens == 1):
            before = context - 1
            return self.cost_model.decode_step_time(len(before), int(before.sum()), int(before.max()))
        return self.cost_model.step_time(zip(lens.tolist(), (context - lens).tolist()))

    def close(self) -> None:
        """Wait until the device has finished every step queued on it."""
        remaining = self._free_at - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
