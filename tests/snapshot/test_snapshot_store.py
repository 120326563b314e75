"""Snapshot writes leave nothing behind: a failed save removes its temporary directory, a dead one's goes next time."""

import os
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxpaged.snapshot.store import BlockRecord, block_digest, read_meta, write_snapshot

IDENTITY = {"format_version": 3}


def _one_block(seed: int):
    data = np.random.default_rng(seed).standard_normal((2, 1, 1, 4, 2)).astype(np.float32)  # [2, L, Hkv, B, D]
    record = BlockRecord(bytes([seed]) * 32, None, (1, 2, 3, 4), digest=block_digest(data))
    kv = {"k": [data[0, 0][:, None]], "v": [data[1, 0][:, None]]}  # per layer [Hkv, rows, B, D]
    return [record], kv


def _leftovers(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f"{path.name}.tmp-"))


def test_a_failed_save_removes_its_temporary_directory_and_keeps_the_earlier_snapshot(tmp_path, monkeypatch):
    path = tmp_path / "snap"
    write_snapshot(path, IDENTITY, *_one_block(1))
    before = read_meta(path)

    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", fail)
    with pytest.raises(OSError, match="disk full"):
        write_snapshot(path, IDENTITY, *_one_block(2))
    assert _leftovers(path) == []
    assert read_meta(path) == before


def test_the_next_save_removes_what_a_dead_process_left_and_keeps_a_live_ones(tmp_path):
    path = tmp_path / "snap"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited: no process with that id runs now (ids are not reused this soon)
    (tmp_path / f"snap.tmp-{dead_pid}-0123abcd" / "kv").mkdir(parents=True)
    live = tmp_path / f"snap.tmp-{os.getpid()}-4567cdef"  # as if another save of this process were under way
    live.mkdir()
    write_snapshot(path, IDENTITY, *_one_block(3))
    assert _leftovers(path) == [live.name]
    assert read_meta(path)[1] == 1
