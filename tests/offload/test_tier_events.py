"""KV events of the host and disk tiers: replaying each tier's events mirrors what that tier holds."""

import numpy as np

from jaxpaged.cache import chain_block_hashes
from jaxpaged.cache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventLog,
    replay,
)
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.offload.disk_tier import DiskKVCache, format_tag
from jaxpaged.offload.host_tier import HostBlock, HostKVCache
from jaxpaged.sampling_params import SamplingParams
from tests.offload.tier_waves import waves

BS = 4
SHAPE = (2, 2, 2, BS, 8)
BLOCK_BYTES = int(np.prod(SHAPE)) * 4
TINY_BLOCK_BYTES = 2 * 2 * 2 * BS * 16 * 4  # K/V x layers x kv heads x block size x head dim x float32
FILE_BYTES = TINY_BLOCK_BYTES + 109  # a disk block file: the block plus its header (no salt)
DISK_FILES = 70  # room for the waves that are reused, not for the unrelated one before them
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TIERS = ("device", "host", "disk")


def _key(i: int) -> bytes:
    return bytes([i]) * 32


def _block(seed):
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


# ------------------------------------------------------------------ the tiers on their own


def test_host_tier_events_follow_puts_evictions_and_pins():
    host = HostKVCache(3 * BLOCK_BYTES, BLOCK_BYTES)
    host.put(_key(9), HostBlock(None, None, (9,) * BS))  # before events: announced when they start
    log = KVEventLog(include_token_ids=True)
    host.attach_events(log, BS)
    mirror = replay(log.take(), tier="host")
    assert mirror == {_key(9)}

    def check():
        events = log.take()
        assert all(e.tier == "host" for e in events)
        replay(events, mirror, tier="host")
        assert mirror == {h for h, _ in host.items()}
        return events

    host.put(_key(1), HostBlock(None, None, (1,) * BS))
    assert check() == [BlockStored((_key(1),), None, (1,) * BS, BS, "host")]
    host.put(_key(2), HostBlock(None, _key(1), (2,) * BS))
    assert check() == [BlockStored((_key(2),), _key(1), (2,) * BS, BS, "host")]
    host.put(_key(1), HostBlock())  # a refresh: the tier holds nothing new
    assert check() == []
    host.put(_key(3), HostBlock())  # evicts 9, the least recently used
    assert check() == [BlockStored((_key(3),), None, None, BS, "host"), BlockRemoved((_key(9),), "host")]
    assert host.pin(2)  # room for a swap: two cached entries go, in one event
    assert check() == [BlockRemoved((_key(2), _key(1)), "host")]
    host.attach_events(None, BS)
    host.unpin(2)
    host.put(_key(4), HostBlock())
    assert log.take() == []  # detached: no event work


def _disk(directory, capacity=10 * BLOCK_BYTES, tag=b"identity"):
    disk = DiskKVCache(directory, capacity, BLOCK_BYTES, np.float32, SHAPE)
    if tag is not None:
        disk.tag = format_tag(np.float32, SHAPE, tag)
    return disk


def test_disk_tier_events_follow_writes_deletions_and_disabling(tmp_path, monkeypatch):
    earlier = _disk(tmp_path)
    for i in range(3):
        earlier.store(_key(i), _block(i))
    disk = _disk(tmp_path, capacity=4 * (BLOCK_BYTES + 109), tag=None)  # a later process, format not set yet
    log = KVEventLog()
    disk.attach_events(log, BS)
    assert log.take() == [] and disk.cached_hashes() == []  # every lookup misses: it holds nothing yet
    mirror: set[bytes] = set()

    def check():
        events = log.take()
        assert all(e.tier == "disk" for e in events)
        replay(events, mirror, tier="disk")
        assert mirror == set(disk.cached_hashes())
        return events

    disk.tag = format_tag(np.float32, SHAPE, b"identity")
    assert check() and mirror == {_key(0), _key(1), _key(2)}  # the files found at start, now usable
    disk.store(_key(3), _block(3), parent_hash=_key(2))
    assert check() == [BlockStored((_key(3),), _key(2), None, BS, "disk")]
    disk.store(_key(4), _block(4))  # over capacity: the oldest file goes
    assert check()[-1] == BlockRemoved((_key(0),), "disk")
    (tmp_path / f"{_key(1).hex()}.kvblk").write_bytes(b"garbage")
    assert disk.load(_key(1)) is None
    assert check() == [BlockRemoved((_key(1),), "disk")]
    again = KVEventLog()
    disk.attach_events(again, BS)  # a second log starts with the files held, parents first
    announced = again.take()
    assert replay(announced, tier="disk") == set(disk.cached_hashes())
    assert [e.block_hashes for e in announced if _key(3) in e.block_hashes] == [(_key(2), _key(3))]
    disk.attach_events(log, BS)
    log.take()

    def full(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(tmp_path), "write_bytes", full)
    disk.store(_key(5), _block(5))
    assert disk.disabled and check() == [AllBlocksCleared("disk")] and mirror == set()


# ------------------------------------------------------------------ an engine with both tiers



def _contents(engine) -> dict[str, set[bytes]]:
    tiers = engine.tiers
    disk = set(tiers.disk.cached_hashes()) if tiers.disk is not None else set()
    return {"device": {b.block_hash for b in engine.kv.cached_blocks()},
            "host": {h for h, _ in tiers.host.items()}, "disk": disk}


def _check_stored(events) -> None:
    """A stored block's hash follows from its parent and tokens, where the event has both."""
    for e in events:
        if isinstance(e, BlockStored) and e.parent_block_hash is not None and e.token_ids is not None:
            assert chain_block_hashes(e.parent_block_hash, e.token_ids, BS) == list(e.block_hashes)


def _serve_mirrored(engine, prompts, mirrors, prefix, counts):
    """Serve `prompts`, replaying the events after every step into `mirrors` (one set per tier)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{prefix}{i}", prompt, PARAMS)
    while engine.has_unfinished_requests():
        engine.step()
        events = engine.kv.take_events()
        _check_stored(events)
        for e in events:
            if isinstance(e, BlockStored) and e.tier == "device":  # a promotion: the pool gains a lower tier's block
                counts["promoted"] += sum(h in mirrors["host"] or h in mirrors["disk"] for h in e.block_hashes)
            counts[type(e).__name__, e.tier] = counts.get((type(e).__name__, e.tier), 0) + 1
        for tier, mirror in mirrors.items():
            replay(events, mirror, tier=tier)
        assert mirrors == _contents(engine)


def _engine(model, **config):
    return Engine(EngineConfig(model="tiny", num_blocks=24, block_size=BS, max_num_batched_tokens=64, **config),
                  model=model)


def test_engine_tier_events_mirror_every_tier_through_offload_eviction_and_reload(tiny_model, tmp_path):
    engine = _engine(tiny_model, host_cache_bytes=4 * TINY_BLOCK_BYTES, disk_cache_dir=str(tmp_path),
                     disk_cache_bytes=DISK_FILES * FILE_BYTES)  # a tiny host: most blocks go on to disk
    log = engine.kv.enable_events(include_token_ids=True)
    mirrors = {tier: replay(log.take(), tier=tier) for tier in TIERS}
    counts = {"promoted": 0}
    # unrelated blocks first: the disk deletes them to make room for the later waves
    for n, wave in enumerate([waves(seed=1)[1], *waves()]):
        _serve_mirrored(engine, wave, mirrors, f"w{n}-", counts)
    for kind in ("BlockStored", "BlockRemoved"):
        for tier in TIERS:
            assert counts.get((kind, tier), 0) > 0, (kind, tier, counts)
    stats = engine.tiers.stats
    assert stats.host_hits > 0 and stats.disk_hits > 0 and counts["promoted"] > 0, (stats, counts)

    # an engine started later over the same directory announces its files when events start
    later = _engine(tiny_model, host_cache_bytes=4 * TINY_BLOCK_BYTES, disk_cache_dir=str(tmp_path),
                    disk_cache_bytes=DISK_FILES * FILE_BYTES)
    announced = later.kv.enable_events().take()
    assert replay(announced, tier="disk") == set(later.tiers.disk.cached_hashes()) == mirrors["disk"] != set()
    assert replay(announced) == set() and replay(announced, tier="host") == set()


def test_events_off_means_no_tier_event_work(tiny_model, tmp_path):
    engine = _engine(tiny_model, host_cache_bytes=4 * TINY_BLOCK_BYTES, disk_cache_dir=str(tmp_path))
    engine.kv.enable_events()
    engine.kv.disable_events()
    assert engine.tiers.host._events is None and engine.tiers.disk._events is None
    _, filler, _ = waves()
    for i, prompt in enumerate(filler[:4]):
        engine.add_request(f"f{i}", prompt, PARAMS)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.tiers.stats.offloaded > 0 and engine.kv.take_events() == []


def test_enabling_events_after_a_snapshot_restore_announces_the_restored_blocks(tiny_model, tmp_path):
    """The snapshot restored into a new engine (device and host tiers), then events: replay equals the caches."""
    first = _engine(tiny_model, host_cache_bytes=1 << 20)
    first_waves = waves()
    for n, wave in enumerate(first_waves[:2]):  # the shared prefixes end up on the host, the filler on the device
        for i, prompt in enumerate(wave):
            first.add_request(f"w{n}-{i}", prompt, PARAMS)
        while first.has_unfinished_requests():
            first.step()
    assert first.save_prefix_cache(tmp_path / "snap") > 0

    restored = _engine(tiny_model, host_cache_bytes=1 << 20)
    stats = restored.load_prefix_cache(tmp_path / "snap")
    contents = _contents(restored)
    assert stats.num_restored == len(contents["device"]) + len(contents["host"])
    assert contents["device"] and contents["host"]
    announced = restored.kv.enable_events(include_token_ids=True).take()
    _check_stored(announced)
    mirrors = {tier: replay(announced, tier=tier) for tier in TIERS}
    assert mirrors == contents
    for tier in TIERS:  # parents before children, within each tier
        seen: set[bytes] = set()
        for e in announced:
            if e.tier == tier:
                assert e.parent_block_hash is None or e.parent_block_hash not in contents[tier] \
                    or e.parent_block_hash in seen
                seen.update(e.block_hashes)
    device_runs = [e for e in announced if e.tier == "device"]
    assert len(device_runs) < len(contents["device"])  # chains come as runs, not block by block
    assert all(len(e.token_ids) == BS * len(e.block_hashes) for e in device_runs)
    counts = {"promoted": 0}
    _serve_mirrored(restored, first_waves[2], mirrors, "again-", counts)  # and the events go on from there
    assert counts["promoted"] > 0
