"""Runners: what executes the scheduler's steps. `ModelRunner` owns the device pool and the persistent batch.

Also the step's inputs (`step_input`, `buckets`) and the device-side choice of tokens (`sampling`,
`logit_controls`, `rejection`). `from jaxpaged.runner import ModelRunner` imports the name's module on
first use (`jaxpaged.lazy_exports`), so the protocol and the inputs import without the model runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxpaged.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from jaxpaged.runner.input_batch import InputBatch
    from jaxpaged.runner.model_runner import ModelRunner, calibrate_kv_scales
    from jaxpaged.runner.protocol import (DeviceTimeRunner, KVPoolRunner, PendingBlocks, PredictableRunner, Runner,
                                          RunnerCapabilities, StepHandle)

_HOMES = {"InputBatch": "input_batch", "ModelRunner": "model_runner", "calibrate_kv_scales": "model_runner",
          "DeviceTimeRunner": "protocol", "KVPoolRunner": "protocol", "PendingBlocks": "protocol",
          "PredictableRunner": "protocol", "Runner": "protocol", "RunnerCapabilities": "protocol",
          "StepHandle": "protocol"}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
