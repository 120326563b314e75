"""A device backend that executes nothing: each step occupies a simulated device for its predicted time.

The engine's scheduler and KV cache manager run unchanged over it; only the
runner differs. The simulated runner returns one fixed token for every
sequence, chosen so it is never EOS or a stop token of the model config, so
workloads must fix output lengths with `max_tokens` (and `ignore_eos`). It
allocates no arrays, ignores block tables and never compiles
(`num_compiles == 0`).

Time: a step dispatched at simulated time `t` starts when the device is free
(`max(t, end of the previous step)`) and ends its predicted seconds later;
waiting for its result moves the clock to that end. Synchronous scheduling
(dispatch, then wait) advances the clock by each step's time in turn; with
asynchronous scheduling the host's work between steps costs no simulated time,
so steps run back to back either way.
"""

from __future__ import annotations

import numpy as np

from jaxpaged.config import ModelConfig
from jaxpaged.runner.protocol import RunnerCapabilities
from jaxpaged.scheduler.output import ModelOutput, SchedulerOutput
from jaxpaged.sim.cost_model import CostModel


class SimClock:
    """Simulated seconds; pass as the engine's `clock` so its timestamps are simulated too."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds` (a step ran, or the device idled)."""
        if seconds < 0:
            raise ValueError(f"time cannot go backwards ({seconds} s)")
        self.now += seconds

    def advance_to(self, t: float) -> None:
        """Move time forward to `t` if it is later than now."""
        self.now = max(self.now, t)


def fixed_token(config: ModelConfig) -> int:
    """The token every simulated step samples: 0, or 1 when 0 is the model's EOS."""
    return 1 if config.eos_token_id == 0 else 0


class _SimulatedStep:
    """A step that ends at simulated time `end`; its result is the fixed token for every sequence."""

    def __init__(self, clock: SimClock, end: float, num_seqs: int, token: int):
        self._clock, self._end, self._num_seqs, self._token = clock, end, num_seqs, token

    def result(self) -> ModelOutput:
        self._clock.advance_to(self._end)
        n = self._num_seqs
        return ModelOutput(token_ids=np.full(n, self._token, np.int32), logprobs=np.zeros(n, np.float32))


class SimulatedRunner:
    """Engine runner whose steps cost time on a `SimClock` instead of running a model."""

    num_compiles = 0
    # a fixed token: no prompt logprobs, no beam search, no token masks; every step samples `token` and costs
    # `cost_model`'s time on `clock`: the engine may run plain decode steps in bulk (`Engine.fast_forward`),
    # accounting each with `account_step`
    capabilities = RunnerCapabilities(computes_logits=False, samples_under_token_masks=False,
                                      predictable_steps=True, counts_device_time=True)
    wait_s = 0.0  # the host never waits for a simulated clock

    def __init__(self, config: ModelConfig, cost_model: CostModel, clock: SimClock, *, num_blocks: int):
        """A pool of `num_blocks` blocks of `cost_model.block_size` tokens (nothing is allocated)."""
        self.config = config
        self.cost_model = cost_model
        self.clock = clock
        self.block_size = cost_model.block_size
        self.num_blocks = num_blocks
        self.token = fixed_token(config)
        self.num_steps = 0
        self.busy_s = 0.0  # simulated seconds spent in steps and copies
        self.device_free_at = clock.now  # when the last dispatched step ends

    def reset(self) -> None:
        """Nothing to forget: the simulator keeps no rows."""

    def account_step(self, seconds: float) -> None:
        """A step of `seconds` run outside `execute_model` (the engine's decode fast-forward): the clock
        moves by it and it counts as a step and as busy time."""
        self.clock.advance(seconds)
        self.busy_s += seconds
        self.num_steps += 1

    def computed_chunks(self, scheduler_output: SchedulerOutput) -> list[tuple[int, int]]:
        """The step's work as `(num_new_tokens, num_context_tokens_before)` per chunk: each scheduled
        sequence's tokens (a subclass may leave out tokens whose K/V arrived from elsewhere)."""
        return list(zip(scheduler_output.num_tokens, scheduler_output.starts))

    def execute_model(self, scheduler_output: SchedulerOutput) -> _SimulatedStep:
        """Occupy the device for the copy-on-write copies and the step's predicted time."""
        if scheduler_output.num_top_logprobs:
            raise NotImplementedError("the simulator does not model beam search")
        seconds = 0.0
        if scheduler_output.copies:
            seconds += self.cost_model.copy_time(len(scheduler_output.copies))
        if scheduler_output.seqs:
            seconds += self.cost_model.step_time(self.computed_chunks(scheduler_output))
            self.num_steps += 1
        self.busy_s += seconds
        self.device_free_at = max(self.clock.now, self.device_free_at) + seconds
        return _SimulatedStep(self.clock, self.device_free_at, scheduler_output.num_seqs, self.token)
