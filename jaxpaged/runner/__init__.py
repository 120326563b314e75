"""Runners: what executes the scheduler's steps. `ModelRunner` owns the device pool and the persistent batch."""

from jaxpaged.runner.input_batch import InputBatch
from jaxpaged.runner.model_runner import ModelRunner, calibrate_kv_scales
from jaxpaged.runner.protocol import KVPoolRunner, PendingBlocks, Runner, StepHandle
from jaxpaged.scheduler.output import ModelOutput

__all__ = ["InputBatch", "KVPoolRunner", "ModelOutput", "ModelRunner", "PendingBlocks", "Runner", "StepHandle",
           "calibrate_kv_scales"]
