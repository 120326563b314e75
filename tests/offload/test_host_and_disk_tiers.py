"""The host LRU and the disk block store on their own: byte bounds, pinning, and corruption as a miss."""

import numpy as np
import pytest

from jaxpaged.offload.disk_tier import DiskKVCache, format_tag
from jaxpaged.offload.host_tier import HostBlock, HostKVCache

SHAPE = (2, 2, 2, 4, 8)  # [K/V, layers, kv heads, block size, head dim]
BLOCK_BYTES = int(np.prod(SHAPE)) * 4


def _block(seed):
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def test_host_lru_is_bounded_in_bytes_and_evicts_least_recent():
    evicted = []
    host = HostKVCache(3 * BLOCK_BYTES + 5, BLOCK_BYTES, on_evict=lambda h, b: evicted.append(h))
    for key in (b"a", b"b", b"c"):
        host.put(key, HostBlock(_block(0)))
    assert host.get(b"a") is not None  # a is now most recent
    host.put(b"d", HostBlock())
    assert evicted == [b"b"] and b"b" not in host and len(host) == 3
    assert host.used_bytes == 3 * BLOCK_BYTES <= 3 * BLOCK_BYTES + 5


def test_pinned_blocks_share_the_budget_and_are_refused_beyond_it():
    host = HostKVCache(4 * BLOCK_BYTES, BLOCK_BYTES)
    for key in (b"a", b"b", b"c"):
        host.put(key, HostBlock())
    assert host.pin(3)  # evicts two cached entries to make room
    assert len(host) == 1 and host.used_bytes == 4 * BLOCK_BYTES
    assert not host.pin(2)  # 3 + 2 pinned > 4: refused, nothing changed
    assert host.num_pinned == 3 and len(host) == 1
    host.unpin(3)
    assert host.num_pinned == 0
    with pytest.raises(ValueError, match="smaller than one KV block"):
        HostKVCache(BLOCK_BYTES - 1, BLOCK_BYTES)


def _disk(tmp_path, capacity=10 * BLOCK_BYTES, tag=b"x"):
    disk = DiskKVCache(tmp_path, capacity, BLOCK_BYTES, np.float32, SHAPE)
    disk.tag = format_tag(np.float32, SHAPE, tag)
    return disk


def test_disk_round_trip_and_survives_restart(tmp_path):
    disk = _disk(tmp_path)
    data = _block(1)
    disk.store(b"\x01" * 32, data)
    np.testing.assert_array_equal(disk.load(b"\x01" * 32), data)
    assert disk.load(b"\x02" * 32) is None
    again = _disk(tmp_path)  # a new process over the same directory
    np.testing.assert_array_equal(again.load(b"\x01" * 32), data)
    other_scales = _disk(tmp_path, tag=b"other fp8 scales")
    assert other_scales.load(b"\x01" * 32) is None  # written under another format: a miss


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate", "empty"])
def test_damaged_disk_block_is_a_miss(tmp_path, damage):
    disk = _disk(tmp_path)
    key = b"\x07" * 32
    disk.store(key, _block(2))
    path = next(tmp_path.glob("*.kvblk"))
    blob = bytearray(path.read_bytes())
    if damage == "flip_payload":
        blob[-17] ^= 0x01
    elif damage == "flip_header":
        blob[12] ^= 0x80
    elif damage == "truncate":
        blob = blob[:-3]
    else:
        blob = bytearray()
    path.write_bytes(bytes(blob))
    assert disk.load(key) is None
    assert disk.num_corrupt == 1 and not path.exists() and len(disk) == 0


def test_disk_is_bounded_in_bytes(tmp_path):
    disk = _disk(tmp_path, capacity=3 * (BLOCK_BYTES + 200))
    keys = [bytes([i]) * 32 for i in range(5)]
    for i, key in enumerate(keys):
        disk.store(key, _block(i))
    assert len(disk) == 3 and disk.used_bytes <= disk.capacity_bytes
    assert sum(p.stat().st_size for p in tmp_path.glob("*.kvblk")) == disk.used_bytes
    assert disk.load(keys[0]) is None and disk.load(keys[4]) is not None  # oldest went first


# salts as the server's tenants spell them (jaxpaged.server.tenants): a tenant, a namespace inside it, another
# tenant whose name starts alike, a client's free-form salt and none
SALTS = ['["tenant", "alice"]', '["tenant", "alice", "sub"]', '["tenant", "alice2"]', "alice", None]
ALICE = ("tenant", "alice")


def test_host_tier_drops_exactly_a_namespaces_entries():
    host = HostKVCache(10 * BLOCK_BYTES, BLOCK_BYTES)
    for i, salt in enumerate(SALTS):
        host.put(bytes([i]), HostBlock(_block(i), cache_salt=salt))
    assert host.drop_namespace(ALICE) == 2
    assert [bytes([i]) in host for i in range(len(SALTS))] == [False, False, True, True, True]


def test_disk_tier_drops_a_namespaces_files_also_after_a_restart(tmp_path):
    disk = _disk(tmp_path)
    for i, salt in enumerate(SALTS):
        disk.store(bytes([i]) * 32, _block(i), cache_salt=salt)
    again = _disk(tmp_path)  # a later process: the salts are only in the files' headers
    assert again.drop_namespace(ALICE) == 2
    assert sorted(p.stem[:2] for p in tmp_path.glob("*.kvblk")) == ["02", "03", "04"]
    for i, salt in enumerate(SALTS[2:], start=2):
        np.testing.assert_array_equal(again.load(bytes([i]) * 32), _block(i))
        assert again.salt_of(bytes([i]) * 32) == salt
    assert disk.drop_namespace(("tenant", "alice2")) == 1  # the first process's index, files read as written
    assert not (tmp_path / f"{'02' * 32}.kvblk").exists()


def test_a_damaged_salt_is_a_miss_not_a_file_in_another_namespace(tmp_path):
    disk = _disk(tmp_path)
    key = b"\x09" * 32
    disk.store(key, _block(3), cache_salt=SALTS[0])
    path = next(tmp_path.glob("*.kvblk"))
    blob = bytearray(path.read_bytes())
    blob[blob.index(b"alice")] ^= 0x01  # "alice" -> "`lice": the payload is intact, the salt is not
    path.write_bytes(bytes(blob))
    assert _disk(tmp_path).load(key) is None
