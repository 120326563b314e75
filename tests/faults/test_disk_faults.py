"""Disk-tier faults: failed writes disable the tier and serving goes on; engines may share a directory."""

import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.offload.disk_tier import DiskKVCache, format_tag
from jaxpaged.sampling_params import SamplingParams
from tests.faults.fault_helpers import run_prompts

SHAPE = (2, 2, 2, 4, 8)
BLOCK_BYTES = int(np.prod(SHAPE)) * 4
BS = 4
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
RNG = np.random.default_rng(5)
WAVE = [[int(t) for t in RNG.integers(0, 250, n)] for n in (23, 31, 27, 35, 29, 33)]
TINY_BLOCK_BYTES = 2 * 2 * 2 * BS * 16 * 4
REPO = Path(__file__).resolve().parents[2]


def _disk(directory, capacity=10 * BLOCK_BYTES):
    disk = DiskKVCache(directory, capacity, BLOCK_BYTES, np.float32, SHAPE)
    disk.tag = format_tag(np.float32, SHAPE, b"identity")
    return disk


def _block(seed):
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def _run(engine, prompts, prefix="r"):
    return run_prompts(engine, prompts, GREEDY, prefix)


@pytest.fixture(scope="module")
def recomputed(tiny_model):
    engine = Engine(EngineConfig(model="tiny", block_size=BS, num_blocks=24, enable_prefix_caching=False),
                    model=tiny_model)
    return _run(engine, WAVE + WAVE)


@pytest.mark.parametrize("fault", ["directory vanishes", "disk full"])
def test_failed_disk_write_disables_the_tier_once_and_serving_continues(tiny_model, recomputed, tmp_path,
                                                                        monkeypatch, caplog, fault):
    directory = tmp_path / "disk"
    engine = Engine(EngineConfig(model="tiny", block_size=BS, num_blocks=24, host_cache_bytes=2 * TINY_BLOCK_BYTES,
                                 disk_cache_dir=str(directory)), model=tiny_model)
    if fault == "directory vanishes":
        shutil.rmtree(directory)
    else:
        def full(self, data):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(Path, "write_bytes", full)
    with caplog.at_level(logging.WARNING, logger="jaxpaged.offload.disk_tier"):
        assert _run(engine, WAVE + WAVE) == recomputed
    disk = engine.tiers.disk
    assert disk.disabled and engine.tiers.stats.disk_write_errors == 1  # no retry after the first failure
    assert len([r for r in caplog.records if "disabled" in r.getMessage()]) == 1
    assert not list(tmp_path.rglob("*.tmp"))


def test_vanished_file_is_a_miss(tmp_path):
    disk = _disk(tmp_path)
    disk.store(b"a" * 32, _block(1))
    (tmp_path / f"{(b'a' * 32).hex()}.kvblk").unlink()  # another engine evicted it
    assert disk.load(b"a" * 32) is None
    assert disk.num_vanished == 1 and disk.num_corrupt == 0 and len(disk) == 0


def test_start_up_skips_files_deleted_while_it_scans(tmp_path, monkeypatch):
    first = _disk(tmp_path)
    for i in range(3):
        first.store(bytes([i]) * 32, _block(i))
    real_stat = Path.stat
    doomed = tmp_path / f"{(bytes([1]) * 32).hex()}.kvblk"

    def racing_stat(self, *args, **kwargs):
        if self == doomed:
            self.unlink(missing_ok=True)  # another process deletes it between the listing and the stat
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", racing_stat)
    second = _disk(tmp_path)
    assert len(second) == 2 and bytes([1]) * 32 not in second._sizes


def test_temporary_names_are_unique_per_write(tmp_path, monkeypatch):
    import os
    sources = []
    real_replace = os.replace

    def spy(src, dst):
        sources.append(Path(src).name)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    a, b = _disk(tmp_path), _disk(tmp_path)
    a.store(b"k" * 32, _block(1))
    b._sizes.clear()
    b.store(b"k" * 32, _block(1))
    assert len(sources) == 2 and len(set(sources)) == 2 and all(str(os.getpid()) in s for s in sources)


_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    from jaxpaged.offload.disk_tier import DiskKVCache, format_tag
    shape = (2, 2, 2, 4, 8)
    nbytes = int(np.prod(shape)) * 4
    disk = DiskKVCache(sys.argv[1], 6 * nbytes, nbytes, np.float32, shape)
    disk.tag = format_tag(np.float32, shape, b"identity")
    rng = np.random.default_rng(int(sys.argv[2]))
    def block(key):
        return np.random.default_rng(key).standard_normal(shape).astype(np.float32)
    hits = 0
    for _ in range(400):
        key = int(rng.integers(0, 12))
        got = disk.load(bytes([key]) * 32)
        if got is None:
            disk.store(bytes([key]) * 32, block(key))
        else:
            assert np.array_equal(got, block(key)), "wrong data served"
            hits += 1
    print(hits, disk.num_corrupt)
""")


def test_two_processes_share_one_disk_directory(tmp_path):
    """Two processes read, write and evict the same small directory at once: every hit holds the right bytes."""
    workers = [subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path), str(seed)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
               for seed in (1, 2)]
    results = [w.communicate(timeout=300) for w in workers]
    for worker, (out, err) in zip(workers, results):
        assert worker.returncode == 0, err
        hits, corrupt = map(int, out.split())
        assert hits > 0 and corrupt == 0
    assert not list(tmp_path.glob("*.tmp"))
