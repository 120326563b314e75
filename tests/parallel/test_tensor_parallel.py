"""Tensor parallelism: argument checks here; the multi-device checks in one subprocess with 8 host devices."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxpaged.config import load_config
from jaxpaged.engine import EngineConfig
from jaxpaged.parallel import validate_tensor_parallel_size

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def test_multidevice_checks_in_a_subprocess():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-n", "0",
                           str(HERE / "multidevice_tp.py")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("size,message", [
    (8, "must divide the model's num_heads"),  # tiny has 4 query heads
    (0, "must be >= 1"),
])
def test_bad_sizes_for_tiny(size, message):
    with pytest.raises(ValueError, match=message):
        validate_tensor_parallel_size(load_config("tiny"), size)


def test_size_fitting_kv_heads_neither_way():
    config = load_config("tiny").replace(num_heads=12, num_kv_heads=4, head_dim=8, intermediate_size=132)
    with pytest.raises(ValueError, match=r"divide num_kv_heads \(4\) or be a multiple of it"):
        validate_tensor_parallel_size(config, 6)


def test_more_devices_than_visible():
    with pytest.raises(ValueError, match="needs 2 devices; 1 are visible"):
        validate_tensor_parallel_size(load_config("tiny"), 2)


def test_engine_config_rejects_nonpositive_size():
    with pytest.raises(ValueError, match="tensor_parallel_size must be at least 1"):
        EngineConfig(tensor_parallel_size=0)
