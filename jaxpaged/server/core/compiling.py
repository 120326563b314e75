"""Adds whose structured-output constraint compiles on a worker thread before the core's loop applies them.

A grammar compiles in milliseconds to tens of milliseconds (and the first
constrained request builds the tokenizer bridge, up to about a second for a
128K vocabulary); on the loop that time would stall every stream. The core
hands such an add here when it arrives: a worker checks it as the engine's add
will (`Engine.validate_prompt`, which compiles the constraint into the
compiled-grammar cache; llguidance releases the GIL meanwhile), and the loop
applies it once the check is done, so the engine's add only copies the
compiled matcher. A constraint that does not compile is answered with its
error, before anything streams, as the engine's add would answer it.
"""

from __future__ import annotations

import concurrent.futures
from typing import Callable

from jaxpaged.server.request_stream import params_from_dict


class PendingCompiles:
    """Commands waiting for their constraint's check, in arrival order."""

    def __init__(self, validate: Callable) -> None:
        """`validate(prompt, params)` raises ValueError when the engine would refuse the add."""
        self._validate = validate
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[tuple[concurrent.futures.Future, object]] = []

    @staticmethod
    def needs(record: dict) -> bool:
        """Whether an engine command is an add with a structured-output constraint to compile."""
        return record["op"] == "add" and record["params"].get("structured_outputs") is not None

    def submit(self, command) -> None:
        """Start checking `command`'s add (its record's prompt and params) on the worker."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        record = command.record
        self._pending.append((self._pool.submit(self._check, record["prompt"], record["params"]), command))

    def _check(self, prompt, params: dict) -> None:
        self._validate(prompt, params_from_dict(params))

    def ready(self) -> list[tuple[object, BaseException | None]]:
        """The commands whose check has ended (with its error, or None), in arrival order; they leave."""
        done = [(f, c) for f, c in self._pending if f.done()]
        if done:
            self._pending = [(f, c) for f, c in self._pending if not f.done()]
        return [(c, f.exception()) for f, c in done]

    def drop(self, which: Callable[[object], bool]) -> list:
        """Take the pending commands `which` selects out (aborted, or their client is gone)."""
        dropped = [c for _, c in self._pending if which(c)]
        if dropped:
            self._pending = [(f, c) for f, c in self._pending if not which(c)]
        return dropped

    def __bool__(self) -> bool:
        return bool(self._pending)
