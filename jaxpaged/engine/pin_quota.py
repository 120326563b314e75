"""Who pinned what: per-owner pin quotas and the bound on all pins together.

`Engine.pin_prefix` asks a `PinLedger` before it pins: an owner (a tenant of
the server) may hold at most ``max_pins`` live pins and ``max_pinned_blocks``
pinned full blocks, and all pins together at most ``max_total_blocks`` blocks
(the engine sets it to its pool's size: pins beyond the pool could not all be
kept anyway). Past a bound the pin is refused with `PinQuotaError` (an HTTP
429) and nothing changes.

A ledger entry is one pinned prefix: (cache salt, its full blocks' tokens),
its block count and its deadline. Re-pinning a prefix replaces its entry (and
moves it to the new owner); ``ttl_s <= 0`` drops it, whoever pinned it; an
entry whose deadline passed no longer counts. Two pinned prefixes that share
blocks are both charged for them: the count errs toward refusing, never
toward letting an owner hold more than its quota.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence


class PinQuotaError(ValueError):
    """A pin that would take its owner, or all pins together, past a bound (nothing was pinned)."""


@dataclasses.dataclass(frozen=True)
class PinQuota:
    """One owner's bounds (None: unbounded)."""

    owner: str
    max_pins: int | None = None
    max_pinned_blocks: int | None = None

    def to_wire(self) -> list:
        """A plain list, for the engine core's messages and multi-host command records."""
        return [self.owner, self.max_pins, self.max_pinned_blocks]

    @classmethod
    def from_wire(cls, value) -> PinQuota | None:
        """The quota `to_wire` wrote (None stays None)."""
        return None if value is None else cls(*value)


@dataclasses.dataclass
class _Entry:
    owner: str | None
    blocks: int
    deadline: float


class PinLedger:
    """The live pins by prefix, and their owners (see the module docstring)."""

    def __init__(self, clock: Callable[[], float], block_size: int, max_total_blocks: int | None) -> None:
        self.clock, self.block_size, self.max_total_blocks = clock, block_size, max_total_blocks
        self._entries: dict[tuple, _Entry] = {}

    def pin(self, token_ids: Sequence[int], cache_salt: str | None, ttl_s: float, quota: PinQuota | None,
            do_pin: Callable[[], int]) -> int:
        """Check the bounds for pinning ``token_ids``'s full blocks, then call ``do_pin`` (the real pin) and
        record it; returns what ``do_pin`` returned. PinQuotaError, before ``do_pin``, past a bound."""
        blocks = len(token_ids) // self.block_size
        key = (cache_salt, tuple(token_ids[:blocks * self.block_size]))
        self._expire()
        if ttl_s <= 0 or blocks == 0:
            result = do_pin()
            if ttl_s <= 0:
                self._entries.pop(key, None)
            return result
        previous = self._entries.get(key)
        others = [e for k, e in self._entries.items() if k != key]
        total = sum(e.blocks for e in others) + blocks
        if self.max_total_blocks is not None and total > self.max_total_blocks:
            raise PinQuotaError(f"ttl_s: pinning {blocks} more blocks would hold {total} pinned blocks, past the "
                                f"server's bound of {self.max_total_blocks}; unpin (ttl_s=0) or wait for pins "
                                "to expire")
        if quota is not None:
            mine = [e for e in others if e.owner == quota.owner]
            if quota.max_pins is not None and len(mine) + 1 > quota.max_pins:
                raise PinQuotaError(f"ttl_s: tenant {quota.owner!r} holds {len(mine)} pins, its limit "
                                    f"(max_pins={quota.max_pins}); unpin one (ttl_s=0) or wait for one to expire")
            held = sum(e.blocks for e in mine)
            if quota.max_pinned_blocks is not None and held + blocks > quota.max_pinned_blocks:
                raise PinQuotaError(f"ttl_s: tenant {quota.owner!r} holds {held} pinned blocks; {blocks} more "
                                    f"would pass its limit (max_pinned_blocks={quota.max_pinned_blocks})")
        result = do_pin()
        owner = quota.owner if quota is not None else (previous.owner if previous else None)
        self._entries[key] = _Entry(owner, blocks, self.clock() + ttl_s)
        return result

    def held(self, owner: str | None) -> tuple[int, int]:
        """(live pins, pinned blocks) of ``owner``."""
        self._expire()
        mine = [e for e in self._entries.values() if e.owner == owner]
        return len(mine), sum(e.blocks for e in mine)

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, e in self._entries.items() if e.deadline <= now]:
            del self._entries[key]
