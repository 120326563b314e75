"""The host allocator setting: when `import jaxpaged` keeps freed memory, and that a run's buffers then stop
faulting in fresh pages (counted by the kernel, in a child process per setting: the setting must apply
before JAX's threads first allocate)."""

import importlib.metadata
import platform
import subprocess
import sys

import pytest

from jaxpaged import host_allocator
from jaxpaged.host_allocator import AUTO, KEEP, SYSTEM, jax_will_run_on_cpu, should_keep_freed_memory


@pytest.mark.parametrize("setting, system, libc, on_cpu, expected", [
    (AUTO, "Linux", "glibc", True, True),
    (AUTO, "Linux", "glibc", False, False),  # a GPU or TPU host is left as it is
    (KEEP, "Linux", "glibc", False, True),
    (SYSTEM, "Linux", "glibc", True, False),
    (AUTO, "Linux", "musl", True, False),  # mallopt's parameters are glibc's
    (KEEP, "Darwin", "", True, False),
])
def test_which_hosts_keep_freed_memory(setting, system, libc, on_cpu, expected):
    assert should_keep_freed_memory(setting, system=system, libc=libc, on_cpu=on_cpu) is expected


def test_an_unknown_setting_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="JAXPAGED_HOST_ALLOCATOR must be one of .*'tcmalloc'"):
        should_keep_freed_memory("tcmalloc", system="Linux", libc="glibc", on_cpu=True)


@pytest.mark.parametrize("platforms, expected", [("cpu", True), ("cuda", False), ("cpu,cuda", True),
                                                 ("tpu,cpu", False), (" CPU ", True)])
def test_jax_platforms_decides_when_set(platforms, expected):
    assert jax_will_run_on_cpu({"JAX_PLATFORMS": platforms}) is expected


def test_an_installed_accelerator_plugin_means_not_cpu(monkeypatch):
    plugin = importlib.metadata.EntryPoint(name="xla_cuda13", value="jax_cuda13_plugin", group="jax_plugins")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [plugin] if group == "jax_plugins" else [])
    assert jax_will_run_on_cpu({}) is False


def test_configure_applies_once_per_process():
    first = host_allocator.configure()  # `import jaxpaged` already called it
    assert host_allocator.configure({"JAXPAGED_HOST_ALLOCATOR": "not-even-valid"}) == first


FAULTS_PER_RUN = """
import resource, statistics
import jaxpaged, jax, jax.numpy as jnp
from jaxpaged import host_allocator
# a 48 MiB temporary (above glibc's largest mmap threshold, 32 MiB) and a small result, as a model step has
step = jax.jit(lambda x, w: (x @ w) @ w.T)
x, w = jnp.ones((1024, 64), jnp.float32), jnp.ones((64, 12288), jnp.float32)
step(x, w).block_until_ready()
faults = []
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step(x, w).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(host_allocator.configure(), statistics.median(faults))
"""


def faults_per_run(setting: str) -> tuple[str, float]:
    env = {"JAXPAGED_HOST_ALLOCATOR": setting, "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", FAULTS_PER_RUN], env=env, capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()
    return out[-2], float(out[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_kept_memory_stops_a_runs_buffers_faulting_in_fresh_pages():
    system_result, system_faults = faults_per_run(SYSTEM)
    kept_result, kept_faults = faults_per_run(AUTO)
    assert (system_result, kept_result) == ("system", "kept")
    assert system_faults > 10_000  # 48 MiB of fresh 4 KiB pages every run
    # kept: the freed temporary is reused (now and then the heap grows by one more, when small allocations
    # have split the free one: the median run faults in nothing)
    assert kept_faults < 1_000
