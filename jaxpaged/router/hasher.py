"""Hash an incoming prompt into the chained block hashes the engines' prefix caches use."""

from __future__ import annotations

from collections.abc import Sequence

from jaxpaged.cache.hashing import digest_fn, hash_request_blocks


class RequestHasher:
    """The engines' block hashing (``jaxpaged.cache.hashing``) with their block size and hash function.

    A router's hasher must match the replicas' engine config, or no hash ever matches.
    """

    def __init__(self, block_size: int, hash_algo: str = "sha256") -> None:
        """``block_size`` and ``hash_algo`` as in the replicas' ``EngineConfig``."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        digest_fn(hash_algo)  # a ValueError naming the allowed algorithms
        self.block_size = block_size
        self.hash_algo = hash_algo

    def block_hashes(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[bytes]:
        """Chained hashes of the prompt's full blocks, the salt mixed into block 0 as the engines do."""
        return hash_request_blocks(token_ids, self.block_size, cache_salt, hash_algo=self.hash_algo)
