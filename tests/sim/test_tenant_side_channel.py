"""The prefix cache as a side channel, measured where time is deterministic: the real engine over the simulated
device (its TTFT is the cost model's, on the simulated clock), with each request's cache salt from the server's
own API key -> tenant -> salt mapping. Tenant B probing tenant A's prompt gets the TTFT and ``cached_tokens`` of a
miss (B's own fresh prompt of the same length), whatever ``cache_salt`` B sends; A's own repeat is a hit, faster,
so the comparison could fail. Without keys the same probe is a hit: the channel the keys close."""

import json
from types import SimpleNamespace

import pytest

from jaxpaged.cache.namespaces import namespace_salt
from jaxpaged.server.routes.state import ServerState
from jaxpaged.server.tenants import TenantKeys, tenant_cache_salt, tenant_namespace
from jaxpaged.sim.scenario import Deployment, run_with_arrivals
from jaxpaged.sim.workloads import WorkloadRequest

KEYS = TenantKeys.from_json(json.dumps({"allow_sub_namespaces": True, "keys": [
    {"key": "sk-alice", "tenant": "alice"}, {"key": "sk-bob", "tenant": "bob"}]}))
DEPLOYMENT = Deployment(model="llama3-8b", profile="h200-141gb", block_size=16, kv_cache_bytes=2**30)
PROMPT_LEN = 1024
SECRET = list(range(1000, 1000 + PROMPT_LEN))  # alice's prompt
FRESH = list(range(5000, 5000 + PROMPT_LEN))  # bob's own, never seen: a miss by construction


def salt_for(keys: TenantKeys | None, api_key: str, client_salt: str | None) -> str | None:
    """The salt the server hashes a request with: `ServerState.cache_salt` of a request that the
    `Authenticate` middleware tagged with the key's tenant."""
    state = ServerState(client=None, served_model_name="m", chat_template=None, registry=None, keys=keys)
    tenant = None if keys is None else keys.tenant_of(api_key)
    return state.cache_salt(SimpleNamespace(state=SimpleNamespace(tenant=tenant)), client_salt)


def probe(keys: TenantKeys | None, bob_salt: str | None = None) -> dict[str, tuple[float, int]]:
    """Alice's prompt twice, then bob's probe of it and bob's fresh prompt, each alone on the device (10
    simulated seconds apart): request -> (TTFT in simulated seconds, cached prompt tokens)."""
    sends = [("alice-miss", "sk-alice", SECRET, None), ("alice-hit", "sk-alice", SECRET, None),
             ("bob-probe", "sk-bob", SECRET, bob_salt), ("bob-fresh", "sk-bob", FRESH, bob_salt)]
    requests = [WorkloadRequest(name, prompt, max_tokens=2, cache_salt=salt_for(keys, key, salt),
                                arrival_time=10.0 * i)
                for i, (name, key, prompt, salt) in enumerate(sends)]
    result = run_with_arrivals(DEPLOYMENT, requests, decode_fast_forward=False)
    return {r.request_id: (r.ttft, r.num_cached_tokens) for r in result.records}


@pytest.mark.parametrize("bob_salt", [None, "alice", namespace_salt(tenant_namespace(KEYS.tenant_of("sk-alice")))])
def test_another_tenants_prompt_costs_bob_a_miss_whatever_salt_he_sends(bob_salt):
    seen = probe(KEYS, bob_salt)
    miss_ttft, miss_cached = seen["bob-fresh"]
    assert miss_cached == 0
    assert seen["bob-probe"] == (pytest.approx(miss_ttft, rel=1e-9), 0)
    assert seen["alice-miss"][0] == pytest.approx(miss_ttft, rel=1e-9)
    hit_ttft, hit_cached = seen["alice-hit"]
    assert hit_cached == PROMPT_LEN - DEPLOYMENT.block_size  # the last block is recomputed (its logits)
    assert hit_ttft < 0.5 * miss_ttft  # a hit is visibly faster: the probe above could have seen one


def test_without_keys_the_same_probe_is_a_hit():
    seen = probe(None)
    assert seen["bob-probe"] == (pytest.approx(seen["alice-hit"][0], rel=1e-9), PROMPT_LEN - DEPLOYMENT.block_size)
    assert seen["bob-probe"][0] < 0.5 * seen["bob-fresh"][0]


def test_the_salt_comes_from_the_key_not_from_the_client():
    alice = tenant_cache_salt(KEYS.tenant_of("sk-alice"), None, True)
    assert salt_for(KEYS, "sk-alice", None) == alice
    assert salt_for(KEYS, "sk-bob", alice) != alice
    assert salt_for(None, "", "x") == "x"
