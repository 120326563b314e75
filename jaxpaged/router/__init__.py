"""Prefix-aware routing over data-parallel replicas, fed by their KV cache events (no transport here).

``Router`` keeps a ``PrefixIndex`` (block hash -> replicas) built from the
replicas' ``jaxpaged.cache.events``, hashes each prompt with the engines' block
hashing (``RequestHasher``: same block size, hash function and cache salt) and
asks a policy: ``PrefixAwarePolicy`` (longest cached prefix minus a load
penalty, least loaded on imbalance or no match), ``RoundRobinPolicy`` or
``LeastLoadedPolicy``.
"""

from jaxpaged.router.hasher import RequestHasher
from jaxpaged.router.index import PrefixIndex
from jaxpaged.router.policies import (
    POLICIES,
    LeastLoadedPolicy,
    PrefixAwarePolicy,
    ReplicaLoad,
    RoundRobinPolicy,
    RouteRequest,
    make_policy,
)
from jaxpaged.router.router import Router

__all__ = [
    "POLICIES",
    "LeastLoadedPolicy",
    "PrefixAwarePolicy",
    "PrefixIndex",
    "ReplicaLoad",
    "RequestHasher",
    "RoundRobinPolicy",
    "RouteRequest",
    "Router",
    "make_policy",
]
