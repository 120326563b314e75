"""Eviction policies over the cached blocks at ref count 0, one module each (see ``base``)."""

from __future__ import annotations

from jaxpaged.cache.eviction.base import EvictionPolicy
from jaxpaged.cache.eviction.lfu import LFUPolicy
from jaxpaged.cache.eviction.lru import LRUPolicy
from jaxpaged.cache.eviction.sieve import SievePolicy
from jaxpaged.cache.eviction.slru import SLRUPolicy

POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LRUPolicy, LFUPolicy, SievePolicy, SLRUPolicy)
}
EVICTION_POLICIES = tuple(POLICIES)


def make_policy(policy: str | EvictionPolicy, num_blocks: int) -> EvictionPolicy:
    """The policy named ``policy`` (one of ``EVICTION_POLICIES``) for a pool of ``num_blocks``, or
    ``policy`` itself when it is already an instance."""
    if not isinstance(policy, str):  # a policy object given whole
        return policy
    cls = POLICIES.get(policy)
    if cls is None:
        raise ValueError(f"eviction_policy must be one of {EVICTION_POLICIES}, got {policy!r}")
    return cls(num_blocks)


__all__ = ["EVICTION_POLICIES", "POLICIES", "EvictionPolicy", "LFUPolicy", "LRUPolicy", "SLRUPolicy",
           "SievePolicy", "make_policy"]
