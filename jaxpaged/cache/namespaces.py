"""Cache namespaces: which cache salts a scoped prefix-cache reset drops.

A namespace is a tuple of strings, spelled as a cache salt by `namespace_salt`
(its JSON array). A salt belongs to namespace ``N`` when it is ``N``'s own salt
or the salt of a namespace nested in ``N`` (``N`` plus more parts): the
server's tenant ``alice`` hashes with ``namespace_salt(("tenant", "alice"))``
and, when sub-namespaces are allowed, a client salt ``s`` inside it with
``namespace_salt(("tenant", "alice", s))``, so resetting ``("tenant",
"alice")`` drops both and nothing of tenant ``alice2``. A salt that is not such
an array (a client's own free-form ``cache_salt``, or none) is in no namespace.
"""

from __future__ import annotations

import json
from functools import lru_cache

Namespace = tuple[str, ...]


def check_namespace(namespace: Namespace) -> Namespace:
    """``namespace`` as a tuple; ValueError unless it is a non-empty sequence of strings (an empty one would
    hold every namespaced salt)."""
    if isinstance(namespace, str) or not namespace or not all(isinstance(p, str) for p in namespace):
        raise ValueError(f"namespace must be a non-empty sequence of strings, got {namespace!r}")
    return tuple(namespace)


def namespace_salt(namespace: Namespace) -> str:
    """The cache salt of ``namespace``: its parts as a JSON array (no two namespaces spell the same salt)."""
    return json.dumps(list(namespace))


@lru_cache(maxsize=1024)
def _parts(salt: str) -> Namespace | None:
    try:
        parts = json.loads(salt)
    except ValueError:
        return None
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        return None
    return tuple(parts)


def salt_in_namespace(salt: str | None, namespace: Namespace) -> bool:
    """Whether blocks hashed with ``salt`` belong to ``namespace`` (itself or one nested in it)."""
    if salt is None:
        return False
    parts = _parts(salt)
    return parts is not None and parts[: len(namespace)] == tuple(namespace)


def salt_of(request_keys: tuple) -> str | None:
    """The cache salt among a request's block-0 extra keys (``hashing.request_extra_keys``), or None."""
    if request_keys and isinstance(request_keys[0], tuple) and len(request_keys[0]) == 2 \
            and request_keys[0][0] == "cache_salt":
        return request_keys[0][1]
    return None
