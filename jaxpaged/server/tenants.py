"""Tenants: who the server authenticated, from an API key, and what follows from it.

A server started with ``--api_key`` or ``--api_keys_file`` maps each key to a
`Tenant` (name, role, limits). The tenant, not the request, then decides:

- the cache namespace: every prompt's cache salt is derived from the tenant's
  name (`tenant_cache_salt`), so no two tenants share a block hash, whatever
  ``cache_salt`` a client sends; with ``allow_sub_namespaces`` a client's own
  ``cache_salt`` is mixed in as a namespace inside its tenant's;
- what it may do: ``/reset_prefix_cache`` by a ``user`` drops only its own
  namespace's cached blocks (`tenant_namespace`), by an ``admin`` every
  tenant's; pins in another tenant's namespace need the ``admin`` role;
- how much it may ask at once: ``max_concurrent_requests`` in the engine
  (waiting or running) and ``max_queued_requests`` waiting for a batch slot,
  counted by the engine's loop across every API server process (past them:
  429 with ``Retry-After``; tenant_admission.py);
- how much it may pin: ``max_pins`` live pins holding at most
  ``max_pinned_blocks`` blocks, counted by the engine (past them: 429;
  jaxpaged/engine/pin_quota.py).

The keys file is JSON::

    {"allow_sub_namespaces": false,
     "keys": [{"key": "sk-...", "tenant": "alice", "role": "user", "max_concurrent_requests": 8,
               "max_pins": 16, "max_pinned_blocks": 512},
              {"key": "sk-...", "tenant": "ops", "role": "admin", "max_queued_requests": 4}]}

Keys are looked up by their SHA-256 digest and then compared with
`hmac.compare_digest`, so response times tell nothing about how much of a
guessed key was right, and a thousand keys cost what one does. With no key configured the server trusts every client,
as it always did, and says so in its log at start.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from pathlib import Path

from jaxpaged.cache.namespaces import Namespace, namespace_salt
from jaxpaged.engine.pin_quota import PinQuota
from jaxpaged.server.tenant_admission import AdmissionLimits

ROLES = ("user", "admin")
LIMITS = ("max_concurrent_requests", "max_queued_requests", "max_pins", "max_pinned_blocks")
SINGLE_KEY_TENANT = "default"  # the tenant of the one ``--api_key``


class PermissionDenied(Exception):
    """The authenticated tenant's role does not allow what it asked (a 403)."""


@dataclasses.dataclass(frozen=True)
class Tenant:
    """One authenticated client identity (see the module docstring)."""

    name: str
    role: str = "user"
    max_concurrent_requests: int | None = None  # requests in the engine (waiting or running); None: no bound
    max_queued_requests: int | None = None  # requests waiting for a batch slot; None: only the server's queue bound
    max_pins: int | None = None  # live pins (POST /v1/cache/pin, pin_ttl_s); None: only the server's bound
    max_pinned_blocks: int | None = None  # full blocks under those pins

    @property
    def is_admin(self) -> bool:
        """Whether this tenant may reset the prefix cache and pin in other tenants' namespaces."""
        return self.role == "admin"


@dataclasses.dataclass(frozen=True)
class TenantKeys:
    """API key -> `Tenant`, and the operator's namespace rule. Picklable (it travels to API server processes)."""

    keys: tuple[tuple[bytes, Tenant], ...]
    allow_sub_namespaces: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("api keys: at least one key is needed")
        object.__setattr__(self, "_by_digest", {hashlib.sha256(key).digest(): (key, t) for key, t in self.keys})

    @classmethod
    def single(cls, api_key: str) -> TenantKeys:
        """One key for every client (vLLM's ``--api-key``): an admin tenant named ``default``."""
        return cls(((_key_bytes(api_key, "api_key"), Tenant(SINGLE_KEY_TENANT, "admin")),))

    @classmethod
    def from_json(cls, text: str, source: str = "api keys file") -> TenantKeys:
        """Parse the keys file's JSON (module docstring); ValueError naming the entry and field that is wrong."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}: not JSON ({error})") from None
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise ValueError(f"{source}: expected an object with a 'keys' list")
        sub = data.get("allow_sub_namespaces", False)
        if not isinstance(sub, bool):
            raise ValueError(f"{source}: allow_sub_namespaces must be true or false, got {sub!r}")
        entries, seen = [], set()
        for i, entry in enumerate(data["keys"]):
            where = f"{source}: keys[{i}]"
            if not isinstance(entry, dict):
                raise ValueError(f"{where} must be an object")
            unknown = set(entry) - {"key", "tenant", "role", *LIMITS}
            if unknown:
                raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
            key = _key_bytes(entry.get("key"), f"{where}.key")
            if key in seen:
                raise ValueError(f"{where}.key repeats an earlier key")
            seen.add(key)
            entries.append((key, _tenant(entry, where)))
        return cls(tuple(entries), sub)

    @classmethod
    def from_options(cls, api_key: str | None, api_keys_file: str | None) -> TenantKeys | None:
        """The keys ``--api_key`` / ``--api_keys_file`` configure (at most one of them), or None for none."""
        if api_key is not None and api_keys_file is not None:
            raise ValueError("give --api_key or --api_keys_file, not both")
        if api_key is not None:
            return cls.single(api_key)
        if api_keys_file is not None:
            return cls.from_json(Path(api_keys_file).read_text(), api_keys_file)
        return None

    def tenant_of(self, presented: str | bytes) -> Tenant | None:
        """The tenant whose key is ``presented``, or None, in O(1) whatever the number of keys: looked up by
        the SHA-256 of ``presented`` (a client cannot steer a digest's bytes, so the lookup's time tells
        nothing about how close a guess was), then compared in constant time."""
        candidate = presented if isinstance(presented, bytes) else presented.encode("utf-8", "surrogateescape")
        key, tenant = self._by_digest.get(hashlib.sha256(candidate).digest(), (b"", None))
        return tenant if hmac.compare_digest(candidate, key) else None

    @property
    def tenant_names(self) -> frozenset[str]:
        """Every configured tenant's name."""
        return frozenset(t.name for _, t in self.keys)


def admission_limits(tenant: Tenant) -> AdmissionLimits:
    """What the engine's loop bounds the tenant's requests by (tenant_admission.py)."""
    return AdmissionLimits(tenant.name, tenant.max_concurrent_requests, tenant.max_queued_requests)


def pin_quota(tenant: Tenant) -> PinQuota:
    """What the engine charges the tenant's pins to."""
    return PinQuota(tenant.name, tenant.max_pins, tenant.max_pinned_blocks)


def tenant_namespace(tenant: Tenant) -> Namespace:
    """The tenant's cache namespace (`jaxpaged.cache.namespaces`): what its ``/reset_prefix_cache`` drops."""
    return ("tenant", tenant.name)


def tenant_cache_salt(tenant: Tenant, client_salt: str | None, allow_sub_namespaces: bool) -> str:
    """The cache salt a tenant's request hashes its blocks with: the tenant's namespace, and inside it the
    client's ``cache_salt`` when the operator allows sub-namespaces (otherwise the client's salt is ignored).
    JSON-encoded (`namespace_salt`), so no (tenant, salt) pair can spell another's, and no unsalted client
    can name it."""
    namespace = tenant_namespace(tenant)
    if allow_sub_namespaces and client_salt is not None:
        namespace += (client_salt,)
    return namespace_salt(namespace)


def _key_bytes(key, where: str) -> bytes:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where} must be a non-empty string")
    return key.encode("utf-8", "surrogateescape")


def _tenant(entry: dict, where: str) -> Tenant:
    name = entry.get("tenant")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.tenant must be a non-empty string")
    role = entry.get("role", "user")
    if role not in ROLES:
        raise ValueError(f"{where}.role must be one of {list(ROLES)}, got {role!r}")
    limits = {}
    for field in LIMITS:
        limit = limits[field] = entry.get(field)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"{where}.{field} must be a positive integer, got {limit!r}")
    return Tenant(name, role, **limits)
