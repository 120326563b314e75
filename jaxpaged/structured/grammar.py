"""Constraints compiled for a sequence: an llguidance matcher plus a static allowed-token mask.

`compile_constraint` turns a request's `structured_outputs` and
`allowed_token_ids` into a `SequenceConstraint` (ValueError naming the problem
when the schema, regex or grammar does not compile). The scheduler feeds it
every token it appends to the sequence (`accept`), and the host fills the
sequence's packed bitmask row before a step samples (`fill_bitmask`). Tokens
only ever enter through `accept`, so a prefix-cache hit, a preemption
(recompute keeps the tokens) or a dropped surplus token changes nothing;
`rollback` undoes accepted tokens (rejected speculative tokens).
"""

from __future__ import annotations

import collections
import json
import logging
import threading

import numpy as np

from jaxpaged.structured.params import StructuredOutputsParams, closed_objects
from jaxpaged.structured.tokenizer_bridge import ll_tokenizer

logger = logging.getLogger(__name__)

BITS = 32  # tokens per packed bitmask word
COMPILED_CACHE_SIZE = 256  # compiled grammars kept (each request starts from a copy of its grammar's matcher)
_compiled: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_compiled_lock = threading.Lock()


def bitmask_width(vocab_size: int) -> int:
    """int32 words per bitmask row: ceil(vocab / 32)."""
    return (vocab_size + BITS - 1) // BITS


def pack_token_ids(token_ids, vocab_size: int) -> np.ndarray:
    """The packed `[ceil(vocab / 32)]` int32 row with exactly `token_ids`' bits set."""
    bits = np.zeros(bitmask_width(vocab_size) * BITS, bool)
    bits[list(token_ids)] = True
    return np.packbits(bits.reshape(-1, BITS)[:, ::-1], axis=1).view(">u4").astype(np.uint32).view(np.int32)[:, 0]


def grammar_text(params: StructuredOutputsParams) -> str:
    """llguidance's grammar for the constraint (not yet checked: the matcher compiles it)."""
    import llguidance

    options = {"whitespace_flexible": not params.disable_any_whitespace}
    if params.kind == "json":
        schema = params.json
        if params.disable_additional_properties and isinstance(schema, dict):
            schema = closed_objects(schema)
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)
    if params.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=options)
    if params.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(params.regex)
    if params.kind == "choice":
        return llguidance.grammar_from("choice", list(params.choice))
    try:
        return llguidance.grammar_from("grammar", params.grammar)  # Lark, or GBNF converted to Lark
    except ValueError as err:
        raise ValueError(f"structured_outputs.grammar does not compile: {err}") from None


class SequenceConstraint:
    """One sequence's constraint: a matcher (None: `allowed_token_ids` only) and a static mask (None: none)."""

    def __init__(self, matcher, allowed: np.ndarray | None, width: int):
        self.matcher = matcher
        self.allowed = allowed
        self.width = width  # int32 words per mask row

    def accept(self, token: int) -> bool:
        """Advance past a sampled token; False if the grammar rejects it (the matcher is then in error)."""
        if self.matcher is None:
            return True
        ok = self.matcher.consume_token(token)
        if not ok:
            logger.warning("structured output: token %d rejected: %s", token, self.matcher.get_error())
        return ok

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        if self.matcher is not None and num_tokens:
            self.matcher.rollback(num_tokens)

    @property
    def is_terminated(self) -> bool:
        """Whether the grammar is finished and admits no more tokens (EOS aside)."""
        return self.matcher is not None and self.matcher.is_stopped()

    def fill_bitmask(self, row: np.ndarray) -> None:
        """Write the tokens allowed next into the packed int32 `row` (contiguous, `[ceil(vocab / 32)]`)."""
        if self.matcher is not None:
            self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            if self.allowed is not None:
                row &= self.allowed
        else:
            row[:] = self.allowed

    def fork(self) -> "SequenceConstraint":
        """An independent copy at the same state (a forked sequence of n > 1)."""
        return SequenceConstraint(None if self.matcher is None else self.matcher.deep_copy(), self.allowed,
                                  self.width)


def compile_constraint(structured: StructuredOutputsParams | None, allowed_token_ids, tokenizer,
                       vocab_size: int) -> SequenceConstraint | None:
    """The sequence constraint for a request (None without one); ValueError naming what does not compile.

    Compiled grammars are cached (LRU, per tokenizer bridge and grammar), so
    the server's check on a worker thread compiles and the engine's add
    copies, as do repeated schemas.
    """
    if structured is None and allowed_token_ids is None:
        return None
    allowed = None
    if allowed_token_ids is not None:
        bad = [t for t in allowed_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"allowed_token_ids entry {bad[0]} is outside the vocabulary [0, {vocab_size})")
        allowed = pack_token_ids(allowed_token_ids, vocab_size)
    matcher = None
    if structured is not None:
        import llguidance

        ll_tok = ll_tokenizer(tokenizer, vocab_size)
        try:
            grammar = grammar_text(structured)
        except Exception as err:  # noqa: BLE001 - whatever the compiler raises is the request's fault
            raise ValueError(f"structured_outputs.{structured.kind} does not compile: {_first_line(str(err))}") \
                from None
        key = (ll_tok, grammar)  # the tokenizer object itself: an id could be reused once it is freed
        with _compiled_lock:
            compiled = _compiled.get(key)
            if compiled is not None:
                _compiled.move_to_end(key)
        if compiled is None:
            compiled = llguidance.LLMatcher(ll_tok, grammar, log_level=0)
            if compiled.is_error():
                raise ValueError(f"structured_outputs.{structured.kind} does not compile: "
                                 f"{_first_line(compiled.get_error())}")
            with _compiled_lock:
                _compiled[key] = compiled
                if len(_compiled) > COMPILED_CACHE_SIZE:
                    _compiled.popitem(last=False)
        matcher = compiled.deep_copy()  # the cached matcher stays at the grammar's start
    return SequenceConstraint(matcher, allowed, bitmask_width(vocab_size))


def _first_line(message: str) -> str:
    """The compiler's message on one line, at most 500 characters."""
    text = " ".join(line.strip() for line in message.strip().splitlines() if line.strip())
    return text[:500] or "unknown error"
