"""Scale-out: tensor parallelism over a device mesh (`tensor_parallel`)."""

from jaxpaged.parallel.tensor_parallel import TP_AXIS, TensorParallel, validate_tensor_parallel_size

__all__ = ["TP_AXIS", "TensorParallel", "validate_tensor_parallel_size"]
