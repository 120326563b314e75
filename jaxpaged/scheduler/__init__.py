"""The scheduler: each step's batch under a token budget, and the update from each step's results."""

from jaxpaged.scheduler.beam import beam_score
from jaxpaged.scheduler.output import TOKEN_ON_DEVICE, ModelOutput, NewRow, SchedulerOutput, SchedulerStats
from jaxpaged.scheduler.scheduler import PREEMPTION_MODES, Scheduler, SchedulerConfig

__all__ = ["PREEMPTION_MODES", "TOKEN_ON_DEVICE", "ModelOutput", "NewRow", "Scheduler", "SchedulerConfig",
           "SchedulerOutput", "SchedulerStats", "beam_score"]
