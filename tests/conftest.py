"""Shared fixtures and test-wide JAX settings.

XLA's CPU compiler dominates the suite's time (seconds per step shape), so the
tests (1) compile with LLVM optimisation off, which changes speed, not float
semantics, and (2) share a persistent compilation cache, so runners built in
different tests reuse executables of identical step shapes. The suite's cache
is its own (`$JAXPAGED_CACHE_DIR`, inherited by the servers and scripts tests
start): engines' default "auto" directory never reaches the user's cache.
"""

import os
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import pytest  # noqa: E402

from jaxpaged import compile_cache  # noqa: E402
from jaxpaged.config import load_config  # noqa: E402
from jaxpaged.model import init_model  # noqa: E402

_CACHE = Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax-compile"
os.environ[compile_cache.ENV_DIR] = str(_CACHE)
compile_cache.configure(str(_CACHE))


@pytest.fixture(scope="session")
def tiny_config():
    return load_config("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_config):
    return init_model(tiny_config, seed=0)
