"""Which waiting request the scheduler admits next, and which running one it preempts: the scheduling policy.

- ``fcfs`` (the default): a deque in arrival order; the latest-arrived running
  request is preempted when blocks run out. Exactly the scheduler's behaviour
  before policies existed.
- ``priority``: vLLM's semantics. Each request has an integer ``priority``
  (lower runs first; ties by arrival). The waiting queue is kept in that
  order, a preempted request goes back to its place in it, and when blocks run
  out the running request that ranks last (highest ``priority`` value, then
  latest arrival) is preempted first. A waiting request that ranks before a
  running one may preempt it to get its blocks (vLLM v0's priority
  preemption).
- ``fair``: a virtual token counter per tenant ("Fairness in Serving Large
  Language Models", OSDI'24, VTC). Each step charges the tenants of its batch
  1 per prompt token computed and 2 per token generated; admission takes the
  oldest waiting request of the tenant with the lowest counter, and a tenant
  that comes back after having nothing queued or running starts at the lowest
  counter of those active (so idle time is not banked). When blocks run out the
  latest-arrived request of the tenant with the highest counter is preempted.
  Requests without a tenant count as one tenant.

Each policy is its waiting queue: the deque methods the scheduler uses, plus
what the policy decides, declared on every queue (`WaitingQueue`) so the
scheduler never asks which policy it runs.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

SCHEDULING_POLICIES = ("fcfs", "priority", "fair")
PROMPT_TOKEN_WEIGHT = 1  # VTC's w_p
OUTPUT_TOKEN_WEIGHT = 2  # VTC's w_q: a generated token costs about twice a prompt token (the paper's default)


def arrival_rank(seq) -> tuple[int, int]:
    """FCFS order: the request's arrival, then the sequence's index."""
    return seq.request.arrival_order, seq.index


def priority_rank(seq) -> tuple[int, int, int]:
    """Priority order: the request's priority (lower first), then arrival."""
    return seq.request.priority, seq.request.arrival_order, seq.index


class WaitingQueue(Protocol):
    """The waiting sequences in the policy's order, and the policy's answers (beside the deque methods the
    scheduler uses: append, appendleft, extendleft, popleft, remove, [0], len, iter)."""

    preempts_lower_priority: bool  # a waiting request may preempt a running one that ranks after it

    def victim(self, running: Sequence) -> object:
        """The request to preempt first among ``running`` (non-empty, in rank order)."""
        ...

    def charge(self, seqs: Sequence, starts: Sequence[int], num_tokens: Sequence[int],
               samples: Sequence[bool]) -> None:
        """Book a scheduled step's work to its tenants (only the fair policy counts it)."""
        ...


class _RankOrder:
    """The answers of the policies that rank requests (fcfs, priority): the last-ranked running request is
    preempted first, and no tenant is charged."""

    preempts_lower_priority = False

    def victim(self, running: Sequence) -> object:
        """The last-ranked running request (``running`` is in rank order)."""
        return running[-1].request

    def charge(self, seqs: Sequence, starts: Sequence[int], num_tokens: Sequence[int],
               samples: Sequence[bool]) -> None:
        """Nothing: only the fair policy counts tenants' tokens."""


class FcfsQueue(_RankOrder, collections.deque):
    """The fcfs waiting queue: a deque in arrival order."""


class PriorityQueue(_RankOrder):
    """The waiting queue in `priority_rank` order, with the deque methods the scheduler uses."""

    preempts_lower_priority = True

    def __init__(self) -> None:
        self._seqs: list = []

    def append(self, seq) -> None:
        """Queue ``seq`` at its rank."""
        bisect.insort(self._seqs, seq, key=priority_rank)

    appendleft = append  # a preempted sequence goes back to its rank, not to the front

    def extendleft(self, seqs: Iterable) -> None:
        """Put sequences back (those deferred in one admission pass) at their ranks."""
        for seq in seqs:
            self.append(seq)

    def popleft(self):
        """Remove and return the first-ranked sequence."""
        return self._seqs.pop(0)

    def remove(self, seq) -> None:
        """Drop ``seq`` (an abort)."""
        self._seqs.remove(seq)

    def __getitem__(self, index: int):
        return self._seqs[index]

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator:
        return iter(self._seqs)


class FairQueue:
    """One FIFO per tenant and each tenant's virtual token counter (VTC); the head is the oldest waiting
    sequence of the tenant with the lowest counter. ``is_active(tenant)`` tells whether a tenant has anything
    running (the scheduler's answer), for the counter lift."""

    def __init__(self, is_active) -> None:
        self.counters: dict[str | None, float] = {}
        self._queues: dict[str | None, collections.deque] = {}
        self._is_active = is_active
        self._len = 0

    def append(self, seq) -> None:
        """Queue a new sequence at the back of its tenant's FIFO (lifting a returning tenant's counter)."""
        tenant = seq.request.tenant
        queue = self._queues.get(tenant)
        if queue is None:
            if not self._is_active(tenant):
                active = [c for t, c in self.counters.items() if t in self._queues or self._is_active(t)]
                floor = min(active, default=0.0)
                self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)
            queue = self._queues[tenant] = collections.deque()
        queue.append(seq)
        self._len += 1

    def appendleft(self, seq) -> None:
        """Put a sequence back at the front of its tenant's FIFO (a preempted or deferred one)."""
        tenant = seq.request.tenant
        self._queues.setdefault(tenant, collections.deque()).appendleft(seq)
        self.counters.setdefault(tenant, 0.0)
        self._len += 1

    def extendleft(self, seqs: Iterable) -> None:
        """`appendleft` each (given last first, as deque.extendleft)."""
        for seq in seqs:
            self.appendleft(seq)

    def _head_tenant(self):
        return min(self._queues, key=lambda t: (self.counters[t], self._queues[t][0].request.arrival_order))

    def __getitem__(self, index: int):
        if index != 0 or not self._len:
            raise IndexError("a FairQueue gives only its head, [0]")
        return self._queues[self._head_tenant()][0]

    def popleft(self):
        """Remove and return the head."""
        tenant = self._head_tenant()
        queue = self._queues[tenant]
        seq = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self._len -= 1
        return seq

    def remove(self, seq) -> None:
        """Drop ``seq`` (an abort)."""
        tenant = seq.request.tenant
        queue = self._queues[tenant]
        queue.remove(seq)
        if not queue:
            del self._queues[tenant]
        self._len -= 1

    preempts_lower_priority = False

    def victim(self, running: Sequence) -> object:
        """The latest arrival of the running tenant with the highest virtual token counter."""
        return max(running, key=lambda s: (self.counters.get(s.request.tenant, 0.0), arrival_rank(s))).request

    def charge(self, seqs: Sequence, starts: Sequence[int], num_tokens: Sequence[int],
               samples: Sequence[bool]) -> None:
        """Add each scheduled sequence's served tokens (weighted, `served_tokens`) to its tenant's counter."""
        for seq, start, n, sampled in zip(seqs, starts, num_tokens, samples):
            tenant = seq.request.tenant
            self.counters[tenant] = self.counters.get(tenant, 0.0) + served_tokens(seq, start, n, sampled)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator:
        for queue in self._queues.values():
            yield from queue


def served_tokens(seq, start: int, num_tokens: int, samples: bool) -> int:
    """A step's VTC charge for one sequence: its prompt tokens computed, and its generated token if it samples."""
    prompt = max(min(num_tokens, len(seq.request.prompt_token_ids) - start), 0)
    return PROMPT_TOKEN_WEIGHT * prompt + (OUTPUT_TOKEN_WEIGHT if samples else 0)


def waiting_queue(policy: str, has_running) -> WaitingQueue:
    """The waiting queue of scheduling ``policy`` (one of `SCHEDULING_POLICIES`); ``has_running(tenant)`` tells
    the fair policy whether a tenant has anything running."""
    if policy not in SCHEDULING_POLICIES:
        raise ValueError(f"scheduling_policy must be one of {list(SCHEDULING_POLICIES)}, got {policy!r}")
    return PriorityQueue() if policy == "priority" else FairQueue(has_running) if policy == "fair" else FcfsQueue()
