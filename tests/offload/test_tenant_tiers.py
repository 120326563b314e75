"""The host and disk tiers keep tenants apart: a tenant's blocks offloaded there are restored only for that tenant
(their keys are block hashes, which chain from the tenant's cache salt), and a tenant's reset drops its entries
there too while another tenant's stay. Salts and namespaces come from the server's tenant mapping."""

import pytest

from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.tenants import Tenant, tenant_cache_salt, tenant_namespace
from tests.offload.tier_waves import waves

BS = 4
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TINY_BLOCK_BYTES = 2 * 2 * 2 * BS * 16 * 4  # K/V x layers x kv heads x block size x head dim x float32
ALICE, BOB = Tenant("alice"), Tenant("bob")
HOST = dict(host_cache_bytes=1 << 20)
DISK = dict(host_cache_bytes=4 * TINY_BLOCK_BYTES, disk_cache_bytes=1 << 20)  # most blocks go on to disk


def _engine(model, tmp_path, tiers):
    disk = {"disk_cache_dir": str(tmp_path)} if "disk_cache_bytes" in tiers else {}
    return Engine(EngineConfig(model="tiny", num_blocks=24, block_size=BS, max_num_batched_tokens=64,
                               **tiers, **disk), model=model)


def _run(engine, prompts, tenant, prefix):
    """Serve ``prompts`` as ``tenant``'s requests: (tokens, cached prompt tokens, blocks restored from the tiers)."""
    stats = engine.tiers.stats
    restored = stats.host_hits + stats.disk_hits
    salt = None if tenant is None else tenant_cache_salt(tenant, None, False)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{prefix}{i}", {"prompt_token_ids": prompt, "cache_salt": salt}, PARAMS)
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
    outs = [outs[f"{prefix}{i}"] for i in range(len(prompts))]
    return ([o.outputs[0].token_ids for o in outs], [o.num_cached_tokens for o in outs],
            stats.host_hits + stats.disk_hits - restored)


@pytest.mark.parametrize("tiers", [HOST, DISK], ids=["host", "disk"])
def test_a_tenants_offloaded_blocks_are_restored_only_for_it(tiny_model, tmp_path, tiers):
    engine = _engine(tiny_model, tmp_path, tiers)
    first, filler, again = waves()
    _run(engine, first, ALICE, "a1-")
    _run(engine, filler, None, "f-")  # pushes alice's blocks off the device into the tiers
    bob_tokens, bob_cached, bob_restored = _run(engine, again, BOB, "b-")
    assert bob_restored == 0 and bob_cached[:2] == [0, 0]
    alice_tokens, alice_cached, alice_restored = _run(engine, again, ALICE, "a2-")
    assert alice_restored > 0 and alice_cached[:2] == [40, 28]  # the control: they are there, for alice
    assert alice_tokens == bob_tokens


@pytest.mark.parametrize("tiers", [HOST, DISK], ids=["host", "disk"])
def test_a_tenants_reset_drops_its_tier_entries_and_keeps_the_others(tiny_model, tmp_path, tiers):
    engine = _engine(tiny_model, tmp_path, tiers)
    first, filler, again = waves()
    _run(engine, first, ALICE, "a1-")
    _run(engine, first, BOB, "b1-")
    _run(engine, filler, None, "f-")
    files = len(list(tmp_path.glob("*.kvblk")))
    assert engine.reset_prefix_cache(tenant_namespace(ALICE))
    if tiers is DISK:
        assert 0 < len(list(tmp_path.glob("*.kvblk"))) < files
    _, bob_cached, bob_restored = _run(engine, again, BOB, "b2-")
    assert bob_restored > 0 and bob_cached[:2] == [40, 28]
    _, alice_cached, alice_restored = _run(engine, again, ALICE, "a2-")
    assert alice_restored == 0 and alice_cached[:2] == [0, 0]
    engine.kv.check_invariants()
