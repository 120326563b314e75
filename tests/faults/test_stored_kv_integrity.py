"""Stored K/V is never served to an engine it does not belong to, nor served corrupt.

The reference for every output is an engine that recomputes everything.
"""

import json

import numpy as np
import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.snapshot.store import KV_DIR, META_FILE
from tests.faults.fault_helpers import run_prompts

BS = 4
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
RNG = np.random.default_rng(11)
PROMPTS = [[int(t) for t in RNG.integers(0, 250, n)] for n in (23, 17, 30)]
FILLER = [[int(t) for t in RNG.integers(0, 250, n)] for n in (33, 29, 35)]
BLOCK_BYTES = 2 * 2 * 2 * BS * 16 * 4  # tiny: K/V x layers x kv heads x block x head dim x float32


def _engine(model, **kw):
    kw.setdefault("num_blocks", 32)
    return Engine(EngineConfig(model="tiny", block_size=BS, **kw), model=model)


def _run(engine, prompts, prefix="r"):
    return run_prompts(engine, prompts, GREEDY, prefix)


@pytest.fixture(scope="module")
def other_model(tiny_config):
    return init_model(tiny_config, seed=1)  # same shapes, other weights


@pytest.fixture(scope="module")
def expected(tiny_model, other_model):
    """Each model's outputs for PROMPTS with nothing cached."""
    return {seed: _run(_engine(model, enable_prefix_caching=False), PROMPTS)
            for seed, model in ((0, tiny_model), (1, other_model))}


def _disk_config(directory):
    return dict(host_cache_bytes=2 * BLOCK_BYTES, disk_cache_dir=str(directory), disk_cache_bytes=1 << 22)


def _fill_disk(model, directory):
    engine = _engine(model, num_blocks=24, **_disk_config(directory))
    _run(engine, PROMPTS + FILLER, prefix="fill")  # the filler evicts PROMPTS' blocks to host, then disk
    assert len(list(directory.glob("*.kvblk"))) > 0


def test_disk_tier_of_other_weights_is_never_hit(tiny_model, other_model, expected, tmp_path):
    _fill_disk(tiny_model, tmp_path)
    same = _engine(tiny_model, num_blocks=24, **_disk_config(tmp_path))
    assert _run(same, PROMPTS) == expected[0]
    assert same.tiers.stats.disk_hits > 0  # control: the files are usable by their own engine
    foreign = _engine(other_model, num_blocks=24, **_disk_config(tmp_path))
    assert _run(foreign, PROMPTS) == expected[1]
    assert foreign.tiers.stats.disk_hits == 0


def test_disk_tier_of_another_block_hash_function_is_never_hit(tiny_model, expected, tmp_path):
    _fill_disk(tiny_model, tmp_path)
    other = _engine(tiny_model, num_blocks=24, hash_algo="xxh3_128", **_disk_config(tmp_path))
    assert _run(other, PROMPTS) == expected[0] and other.tiers.stats.disk_hits == 0


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory, tiny_model):
    path = tmp_path_factory.mktemp("snap") / "cache"
    engine = _engine(tiny_model)
    _run(engine, PROMPTS)
    count = engine.save_prefix_cache(str(path))
    return path, count


def _copy(snapshot, tmp_path):
    import shutil
    dst = tmp_path / "copy"
    shutil.copytree(snapshot[0], dst)
    return dst


def _hits(engine, prompts=PROMPTS):
    for i, prompt in enumerate(prompts):
        engine.add_request(f"h{i}", prompt, GREEDY)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step())
    return [outs[f"h{i}"] for i in range(len(prompts))]


def test_snapshot_records_reordered_or_deleted_still_restore_the_right_blocks(snapshot, tiny_model, expected,
                                                                             tmp_path):
    path = _copy(snapshot, tmp_path)
    meta = json.loads((path / META_FILE).read_text())
    blocks = meta["blocks"]
    parents = {b["parent"] for b in blocks}
    del blocks[next(i for i, b in enumerate(blocks) if b["hash"] not in parents)]  # a leaf: nothing descends
    meta["blocks"] = blocks[::-1]
    (path / META_FILE).write_text(json.dumps(meta))
    engine = _engine(tiny_model)
    stats = engine.load_prefix_cache(str(path))
    assert stats.num_restored == snapshot[1] - 1 and stats.num_skipped == 0
    outs = _hits(engine)
    assert [o.outputs[0].token_ids for o in outs] == expected[0]
    assert sum(o.num_cached_tokens for o in outs) > 0
    engine.kv.check_invariants()


def test_snapshot_record_with_a_wrong_digest_is_skipped(snapshot, tiny_model, expected, tmp_path):
    """Swapping two records' digests (as if their K/V rows were swapped) skips both and their descendants."""
    path = _copy(snapshot, tmp_path)
    meta = json.loads((path / META_FILE).read_text())
    roots = [b for b in meta["blocks"] if b["parent"] is None]
    roots[0]["digest"], roots[1]["digest"] = roots[1]["digest"], roots[0]["digest"]
    (path / META_FILE).write_text(json.dumps(meta))
    engine = _engine(tiny_model)
    stats = engine.load_prefix_cache(str(path))
    assert stats.num_skipped >= 2 and stats.num_restored < snapshot[1]
    assert _run(engine, PROMPTS) == expected[0]


def test_flipped_byte_in_kv_data_is_never_served(snapshot, tiny_model, expected, tmp_path):
    """A flipped byte in the K/V files: the restore is refused naming the file, or the block is skipped."""
    path = _copy(snapshot, tmp_path)
    data = max((p for p in (path / KV_DIR).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    data.write_bytes(bytes(blob))
    engine = _engine(tiny_model)
    try:
        stats = engine.load_prefix_cache(str(path))
    except ValueError as err:
        assert str(path / KV_DIR) in str(err)
        assert engine.kv.stats.num_cached_blocks == 0
    else:
        assert stats.num_skipped >= 1
    assert _run(engine, PROMPTS) == expected[0]


@pytest.mark.parametrize("damage", ["truncate", "not json", "no blocks key", "bad hash", "empty"])
def test_corrupt_snapshot_index_is_a_clear_error_naming_the_file(snapshot, tiny_model, tmp_path, damage):
    path = _copy(snapshot, tmp_path)
    index = path / META_FILE
    text = index.read_text()
    meta = json.loads(text)
    if damage == "no blocks key":
        del meta["blocks"]
    if damage == "bad hash":
        meta["blocks"][0]["hash"] = "zz"
    new = {"truncate": text[: len(text) // 2], "not json": "\x00garbage", "empty": "",
           "no blocks key": json.dumps(meta), "bad hash": json.dumps(meta)}[damage]
    index.write_text(new)
    with pytest.raises(ValueError, match=f"snapshot file {index} is corrupt or unreadable"):
        _engine(tiny_model, prefix_cache_snapshot=str(path))


def test_missing_kv_data_is_a_clear_error_naming_the_directory(snapshot, tiny_model, tmp_path):
    import shutil
    path = _copy(snapshot, tmp_path)
    shutil.rmtree(path / KV_DIR)
    with pytest.raises(ValueError, match=f"K/V data {path / KV_DIR} is corrupt or unreadable"):
        _engine(tiny_model).load_prefix_cache(str(path))


def test_fp8_engine_restarts_from_its_own_snapshot_with_hits(tiny_model, tmp_path):
    path = tmp_path / "fp8"
    kw = dict(kv_cache_dtype="fp8_e4m3", prefix_cache_snapshot=str(path))
    first = _engine(tiny_model, save_prefix_cache_on_shutdown=True, **kw)
    before = _run(first, PROMPTS)
    first.shutdown()
    second = _engine(tiny_model, **kw)  # uncalibrated: adopts the snapshot's scales
    for got, want in zip(second.runner.kv_scales(), first.runner.kv_scales()):
        np.testing.assert_array_equal(got, want)
    outs = _hits(second)
    assert [o.outputs[0].token_ids for o in outs] == before
    assert all(o.num_cached_tokens > 0 for o in outs)
