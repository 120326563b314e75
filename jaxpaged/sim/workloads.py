"""Synthetic serving workloads, shared by the serving benchmark and the cost-model simulator.

Token ids are all below 256, so any config with a byte vocabulary (>= 258 ids)
accepts them. Every workload is deterministic given its seed.

Workloads (``make_workload(name, num_requests=..., seed=..., **scales)``):

- ``chatbot``: one shared system prompt (``system_len`` = 512) followed by a
  user turn of about ``user_len`` (= 500, +-``jitter``) tokens; ``output_len``
  (= 200) generated tokens. The reference shape for prefix caching.
- ``unique``: ``prompt_len`` (= 1000, +-``jitter``) tokens with no shared prefix,
  like code completion over unique files.
- ``multiturn``: ``num_requests`` requests grouped in conversations of
  ``num_turns`` (= 4) turns; each turn adds ``user_len`` (= 200) user tokens
  after the previous turn's prompt and answer (``output_len`` = 100).
- ``multitenant``: ``num_tenants`` (= 4) system prompts of ``system_len`` (= 512)
  tokens; each request picks a tenant and carries its ``cache_salt``
  (``tenant-<i>``), so tenants never share cache blocks.
- ``mixed``: prompt lengths uniform in [``min_prompt_len``, ``max_prompt_len``]
  (= [16, 1024]) and output lengths uniform in [``min_output_len``,
  ``max_output_len``] (= [8, 256]); no shared prefix.

Multi-turn conversations: a turn's prompt includes the previous answer, which
only exists at run time. So a multiturn ``WorkloadRequest`` carries only the
*new* user tokens of its turn in ``prompt_token_ids``, plus ``conversation_id``
and ``turn``. A driver keeps a :class:`ConversationHistory`: it submits turn
``k`` only after turn ``k - 1`` finished (and not before the turn's
``arrival_time``), with ``history.full_prompt(request)`` as the prompt, then calls
``history.record(request, full_prompt, output_token_ids)`` when it finishes.
Requests of other workloads have ``conversation_id=None`` and ``turn=0``, and
``full_prompt`` returns their prompt unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

TOKEN_ID_LIMIT = 256  # byte vocabulary: every config accepts ids below this


@dataclasses.dataclass
class WorkloadRequest:
    """One request of a workload.

    Attributes:
      request_id: unique id (``"<workload>-<index>"``).
      prompt_token_ids: the prompt; for multiturn only this turn's new user tokens.
      max_tokens: tokens to generate (run with ``ignore_eos`` so every mode does equal work).
      cache_salt: tenant salt isolating the prefix cache, or None.
      arrival_time: seconds from the start of the run (0 = all at once). For a
        multiturn turn > 0 it is a lower bound: the turn also waits for the previous one.
      conversation_id: the conversation a multiturn request belongs to, else None.
      turn: index of the turn within its conversation (0 for single-turn workloads).
    """

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    cache_salt: str | None = None
    arrival_time: float = 0.0
    conversation_id: str | None = None
    turn: int = 0


class ConversationHistory:
    """Token history of multiturn conversations, built as turns finish."""

    def __init__(self) -> None:
        """Start with no conversation recorded."""
        self._tokens: dict[str, list[int]] = {}
        self._turns: dict[str, int] = {}

    def ready(self, request: WorkloadRequest) -> bool:
        """True when every earlier turn of the request's conversation has finished."""
        if request.conversation_id is None or request.turn == 0:
            return True
        return self._turns.get(request.conversation_id, 0) >= request.turn

    def full_prompt(self, request: WorkloadRequest) -> list[int]:
        """The prompt to send: previous turns' prompts and answers, then this turn's tokens."""
        if request.conversation_id is None:
            return list(request.prompt_token_ids)
        if not self.ready(request):
            raise ValueError(f"{request.request_id}: turn {request.turn} before turn {request.turn - 1} finished")
        return self._tokens.get(request.conversation_id, []) + list(request.prompt_token_ids)

    def record(self, request: WorkloadRequest, full_prompt: Sequence[int], output_token_ids: Sequence[int]) -> None:
        """Remember a finished turn so the next turn's prompt extends it."""
        if request.conversation_id is None:
            return
        self._tokens[request.conversation_id] = list(full_prompt) + list(output_token_ids)
        self._turns[request.conversation_id] = request.turn + 1


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, TOKEN_ID_LIMIT, size=n).tolist()


def _jittered(rng: np.random.Generator, mean: int, jitter: float) -> int:
    """An integer length within +-jitter (a fraction) of mean, at least 1."""
    spread = int(mean * jitter)
    return max(1, int(mean + rng.integers(-spread, spread + 1))) if spread else max(1, mean)


def _chatbot(rng, n, *, system_len=512, user_len=500, output_len=200, jitter=0.1):
    system = _tokens(rng, system_len)
    return [WorkloadRequest(f"chatbot-{i}", system + _tokens(rng, _jittered(rng, user_len, jitter)), output_len)
            for i in range(n)]


def _unique(rng, n, *, prompt_len=1000, output_len=200, jitter=0.1):
    return [WorkloadRequest(f"unique-{i}", _tokens(rng, _jittered(rng, prompt_len, jitter)), output_len)
            for i in range(n)]


def _multiturn(rng, n, *, num_turns=4, user_len=200, output_len=100, jitter=0.1):
    if num_turns < 1:
        raise ValueError(f"num_turns must be at least 1, got {num_turns}")
    # ordered turn by turn, so the first turns of all conversations come first
    num_conversations = math.ceil(n / num_turns)
    requests = []
    for i in range(n):
        turn, conv = divmod(i, num_conversations)
        requests.append(WorkloadRequest(f"multiturn-c{conv}-t{turn}", _tokens(rng, _jittered(rng, user_len, jitter)),
                                        output_len, conversation_id=f"c{conv}", turn=turn))
    return requests


def _multitenant(rng, n, *, num_tenants=4, system_len=512, user_len=500, output_len=200, jitter=0.1):
    if num_tenants < 1:
        raise ValueError(f"num_tenants must be at least 1, got {num_tenants}")
    systems = [_tokens(rng, system_len) for _ in range(num_tenants)]
    requests = []
    for i in range(n):
        tenant = int(rng.integers(num_tenants))
        prompt = systems[tenant] + _tokens(rng, _jittered(rng, user_len, jitter))
        requests.append(WorkloadRequest(f"multitenant-{i}", prompt, output_len, cache_salt=f"tenant-{tenant}"))
    return requests


def _mixed(rng, n, *, min_prompt_len=16, max_prompt_len=1024, min_output_len=8, max_output_len=256):
    if not 1 <= min_prompt_len <= max_prompt_len or not 1 <= min_output_len <= max_output_len:
        raise ValueError("mixed: need 1 <= min <= max for prompt and output lengths")
    return [WorkloadRequest(f"mixed-{i}", _tokens(rng, int(rng.integers(min_prompt_len, max_prompt_len + 1))),
                            int(rng.integers(min_output_len, max_output_len + 1)))
            for i in range(n)]


_BUILDERS = {
    "chatbot": _chatbot,
    "unique": _unique,
    "multiturn": _multiturn,
    "multitenant": _multitenant,
    "mixed": _mixed,
}
WORKLOADS: tuple[str, ...] = tuple(_BUILDERS)


def make_workload(name: str, *, num_requests: int, seed: int = 0, **scales) -> list[WorkloadRequest]:
    """Build ``num_requests`` requests of workload ``name`` (arrival times all 0).

    ``scales`` override the workload's lengths (see the module docstring), e.g.
    ``make_workload("chatbot", num_requests=8, system_len=128, user_len=64, output_len=16)``.
    Unknown names or scale keys raise ValueError (TypeError from Python is converted).
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    rng = np.random.default_rng(seed)
    try:
        return _BUILDERS[name](rng, num_requests, **scales)
    except TypeError as e:
        raise ValueError(f"workload {name!r}: {e}") from None


def assign_arrivals(requests: list[WorkloadRequest], rate: float, seed: int = 0) -> list[WorkloadRequest]:
    """Set Poisson arrival times at ``rate`` requests/s, in list order (in place; returns the list).

    ``rate`` <= 0 or infinite means all at once (every arrival at 0).
    """
    if rate <= 0 or math.isinf(rate):
        for r in requests:
            r.arrival_time = 0.0
        return requests
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=len(requests))
    for r, t in zip(requests, np.cumsum(gaps)):
        r.arrival_time = float(t)
    return requests


def max_context_len(requests: Sequence[WorkloadRequest]) -> int:
    """The longest context (full prompt + output) any request reaches, multiturn history included."""
    longest = 0
    history: dict[str, int] = {}
    for r in sorted(requests, key=lambda r: r.turn):
        prefix = history.get(r.conversation_id, 0) if r.conversation_id is not None else 0
        total = prefix + len(r.prompt_token_ids) + r.max_tokens
        if r.conversation_id is not None:
            history[r.conversation_id] = total
        longest = max(longest, total)
    return longest
