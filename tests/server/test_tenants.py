"""The API-key table and tenant namespaces (jaxpaged/server/tenants.py), against plain rules: every configured
key finds its tenant, no other string does, and no two (tenant, client salt) pairs share a cache salt."""

import json
import pickle

import pytest

from jaxpaged.server.tenants import Tenant, TenantKeys, tenant_cache_salt

KEYS = {"allow_sub_namespaces": True, "keys": [
    {"key": "sk-alice", "tenant": "alice", "max_concurrent_requests": 2},
    {"key": "sk-ops", "tenant": "ops", "role": "admin"},
    {"key": "sk-é", "tenant": "accent"}]}


def test_each_key_finds_its_tenant_and_nothing_else_does():
    keys = TenantKeys.from_json(json.dumps(KEYS))
    assert keys.tenant_of("sk-alice") == Tenant("alice", "user", 2)
    assert keys.tenant_of("sk-ops").is_admin and not keys.tenant_of("sk-alice").is_admin
    assert keys.tenant_of("sk-é".encode()) == Tenant("accent")
    for wrong in ("", "sk-alic", "sk-alice ", "SK-ALICE", "sk-alicesk-ops", "sk-\udce9"):
        assert keys.tenant_of(wrong) is None, wrong
    assert keys.tenant_names == {"alice", "ops", "accent"}
    travelled = pickle.loads(pickle.dumps(keys))  # it travels to the API server processes
    assert travelled == keys and travelled.tenant_of("sk-ops") == Tenant("ops", "admin")


def test_single_key_is_an_admin_and_no_key_is_none():
    assert TenantKeys.single("k").tenant_of("k") == Tenant("default", "admin")
    assert TenantKeys.from_options(None, None) is None
    with pytest.raises(ValueError, match="not both"):
        TenantKeys.from_options("k", "file.json")


@pytest.mark.parametrize("data, message", [
    ("[", "not JSON"),
    ({"keys": {}}, "'keys' list"),
    ({"keys": []}, "at least one key"),
    ({"keys": [{"key": "", "tenant": "a"}]}, r"keys\[0\].key must be a non-empty string"),
    ({"keys": [{"key": "k", "tenant": ""}]}, r"keys\[0\].tenant"),
    ({"keys": [{"key": "k", "tenant": "a", "role": "root"}]}, r"role must be one of \['user', 'admin'\]"),
    ({"keys": [{"key": "k", "tenant": "a", "max_concurrent_requests": 0}]}, "positive integer"),
    ({"keys": [{"key": "k", "tenant": "a", "max_concurrent_requests": True}]}, "positive integer"),
    ({"keys": [{"key": "k", "tenant": "a", "limit": 3}]}, r"unknown field\(s\) \['limit'\]"),
    ({"keys": [{"key": "k", "tenant": "a"}, {"key": "k", "tenant": "b"}]}, r"keys\[1\].key repeats"),
    ({"keys": [{"key": "k", "tenant": "a"}], "allow_sub_namespaces": "yes"}, "true or false"),
])
def test_bad_keys_files_are_refused_naming_the_entry(data, message):
    with pytest.raises(ValueError, match=message):
        TenantKeys.from_json(data if isinstance(data, str) else json.dumps(data))


def test_namespaces_never_collide_and_ignore_the_client_without_sub_namespaces():
    names = ["a", "a:b", "b", "", "tenant", '"', "a\\", '["tenant","a"]']
    salts = [None, "", "b", "a:b", ":b", '["tenant","a"]', "tenant"]
    with_sub = {(t, s): tenant_cache_salt(Tenant(t or "x"), s, True) for t in names for s in salts}
    assert len(set(with_sub.values())) == len({(t or "x", s) for t, s in with_sub})
    for t in names:
        alone = {tenant_cache_salt(Tenant(t or "x"), s, False) for s in salts}
        assert alone == {tenant_cache_salt(Tenant(t or "x"), None, True)}
