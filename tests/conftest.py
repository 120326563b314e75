"""Shared fixtures and test-wide JAX settings.

XLA's CPU compiler dominates the suite's time (seconds per step shape), so the
tests (1) compile with LLVM optimisation off, which changes speed, not float
semantics, and (2) share a persistent compilation cache, so runners built in
different tests, and in every clone on the machine, reuse executables of identical
step shapes. The suite's cache is its own (tests/suite_cache.py, handed on as
`$JAXPAGED_CACHE_DIR` to the servers and scripts tests start): engines' default
"auto" directory never reaches the user's cache.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import pytest  # noqa: E402

from jaxpaged import compile_cache  # noqa: E402
from jaxpaged.config import load_config  # noqa: E402
from jaxpaged.model import init_model  # noqa: E402
from tests.module_order import longest_first, make_scheduler  # noqa: E402
from tests.suite_cache import SUITE_CACHE  # noqa: E402

os.environ[compile_cache.ENV_DIR] = str(SUITE_CACHE)
compile_cache.configure(str(SUITE_CACHE))


@pytest.fixture(scope="session")
def tiny_config():
    return load_config("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_config):
    return init_model(tiny_config, seed=0)


def pytest_configure(config):
    # xdist's controller would re-sort modules by their number of tests; keep the collected order instead
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Modules sharing minutes of session fixtures go to one worker (tests/module_order.py)."""
    return make_scheduler(config, log)


def pytest_collection_modifyitems(session, config, items):
    """Longest modules first (tests/module_order.py), so that no worker is left alone with one at the end."""
    items[:] = longest_first(items)
