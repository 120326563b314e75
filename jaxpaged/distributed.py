"""Multi-host serving: join several processes into one JAX runtime (`jax.distributed`), multi-controller.

Every process runs the same deterministic controller (scheduler, KV cache
manager, persistent batch) on the same requests in the same order and drives
its own devices; the jitted step is one SPMD program over the global mesh, so
each process computes its shards and the collectives cross processes. Nothing
but requests needs to travel between controllers: the scheduler decides from
token counts, hashes and block ids, and every process gets the same sampled
tokens back (the step's outputs are replicated).

How requests reach every process: process 0 alone receives them (the HTTP
server listens there) and, once per engine step, broadcasts what arrived or
was aborted since the last step with `broadcast_object`; every process then
applies that batch in the same order before calling `engine.step()`.

Scripts and the server call `initialize_from_flags()` first thing in `main`:

    --coordinator_address=host0:1234 --num_processes=2 --process_id=0   # on host 0
    --coordinator_address=host0:1234 --num_processes=2 --process_id=1   # on host 1

With `--num_processes=1` (the default) nothing happens.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from absl import flags

COORDINATOR_ADDRESS = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0's coordinator, identical in every process (multi-host)")
NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "processes in the multi-host job (1 = single process)")
PROCESS_ID = flags.DEFINE_integer("process_id", 0, "this process's index in the job, 0 .. num_processes - 1")


def validate(coordinator_address: str | None, num_processes: int, process_id: int) -> None:
    """Raise ValueError for an inconsistent multi-host setting (before anything starts)."""
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
    if num_processes > 1 and not coordinator_address:
        raise ValueError(f"num_processes={num_processes} needs --coordinator_address (host:port of process 0)")
    if coordinator_address and ":" not in coordinator_address:
        raise ValueError(f"coordinator_address must be host:port, got {coordinator_address!r}")


@flags.multi_flags_validator(["coordinator_address", "num_processes", "process_id"])
def _check_flags(values: dict) -> bool:
    try:
        validate(values["coordinator_address"], values["num_processes"], values["process_id"])
    except ValueError as e:
        raise flags.ValidationError(str(e)) from None
    return True


def initialize(coordinator_address: str | None = None, num_processes: int = 1, process_id: int = 0) -> bool:
    """Join the multi-process JAX runtime; returns whether it did (False for one process).

    Call before anything else touches JAX devices. On CPU the processes' collectives
    go through gloo. After this, `jax.devices()` lists every process's devices and
    `EngineConfig(tensor_parallel_size=N)` may span processes.
    """
    validate(coordinator_address, num_processes, process_id)
    if num_processes == 1:
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
    return True


def initialize_from_flags() -> bool:
    """`initialize` with `--coordinator_address`, `--num_processes` and `--process_id`."""
    return initialize(COORDINATOR_ADDRESS.value, NUM_PROCESSES.value, PROCESS_ID.value)


def is_leader() -> bool:
    """Whether this is process 0: the one that receives requests and writes results."""
    return jax.process_index() == 0


def broadcast_object(value=None):
    """Process 0's JSON-serialisable `value`, returned in every process (others pass anything, e.g. None).

    JSON, not pickle: a payload is data only, and equal on every process byte for byte.
    Every process must call this at the same point (it is a collective).
    """
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils
    payload = np.frombuffer(json.dumps(value).encode(), np.uint8) if is_leader() else np.zeros(0, np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int64(payload.size)))
    buffer = np.zeros(size, np.uint8)
    buffer[:payload.size] = payload
    data = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    return json.loads(data.tobytes().decode())


def leave_group() -> None:
    """Leave the jax.distributed group together (a barrier), before process 0's coordinator goes away."""
    jax.distributed.shutdown()
