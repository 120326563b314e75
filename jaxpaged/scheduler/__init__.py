"""The scheduler: each step's batch under a token budget, and the update from each step's results.

Exported names are imported on first use (`jaxpaged.lazy_exports`): `jaxpaged.scheduler.beam` alone
(the output processor's beam ranking) imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxpaged.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from jaxpaged.scheduler.beam import beam_score
    from jaxpaged.scheduler.output import TOKEN_ON_DEVICE, ModelOutput, NewRow, SchedulerOutput, SchedulerStats
    from jaxpaged.scheduler.scheduler import PREEMPTION_MODES, Scheduler, SchedulerConfig

_HOMES = {"beam_score": "beam", "TOKEN_ON_DEVICE": "output", "ModelOutput": "output", "NewRow": "output",
          "SchedulerOutput": "output", "SchedulerStats": "output", "PREEMPTION_MODES": "scheduler",
          "Scheduler": "scheduler", "SchedulerConfig": "scheduler"}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
