"""N-gram prompt lookup: propose what followed the first earlier occurrence of a sequence's suffix.

The first occurrence (as vLLM's original prompt lookup takes it) rather than
the latest: in a sequence that repeats itself the latest occurrence sits just
before the suffix and has a single token after it, the first has k.

Vectorised over the batch with numpy: the sequences' last `window` tokens
are right-aligned in one matrix, so every sequence's suffix sits in the same
columns, and one sliding-window comparison per n-gram length finds the
matches of the whole batch at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

PAD = -1  # never a token id, so it never matches one
DEFAULT_WINDOW = 1024  # tokens looked back over (bounds the host work per step)


class NgramProposer:
    """Prompt lookup (vLLM's "ngram" method): longest suffix first, its first occurrence."""

    drafts_need_slots = False  # reads the host's tokens only
    uses_hidden_states = False

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
                 window: int = DEFAULT_WINDOW):
        """Suffixes of `prompt_lookup_max` down to `prompt_lookup_min` tokens are tried, over the last `window`."""
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, "
                             f"got {prompt_lookup_min}, {prompt_lookup_max}")
        self.num_speculative_tokens = num_speculative_tokens
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self.window = max(window, prompt_lookup_max + 1)

    def propose(self, token_ids: Sequence[Sequence[int]], max_drafts: Sequence[int],
                context=None) -> list[list[int]]:
        """Draft tokens per sequence (see `Proposer.propose`; `context` is not read)."""
        if not token_ids:
            return []
        k = self.num_speculative_tokens
        drafts, counts = self.propose_arrays(token_ids)
        limits = np.clip(np.asarray(max_drafts, np.int64), 0, counts)
        rows = drafts.tolist()
        return [row[:n] for row, n in zip(rows, limits.tolist())] if k else [[] for _ in rows]

    def propose_arrays(self, token_ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """`[B, k]` draft tokens and `[B]` how many of each row are real (0: no n-gram matched)."""
        width = min(self.window, max(map(len, token_ids)))
        batch = np.full((len(token_ids), width), PAD, np.int64)
        lengths = np.empty(len(token_ids), np.int64)
        for b, tokens in enumerate(token_ids):  # gathering the rows; the matching below is vectorised
            tail = tokens[-width:]
            lengths[b] = len(tail)
            batch[b, width - len(tail):] = tail
        k = self.num_speculative_tokens
        drafts = np.zeros((len(token_ids), k), np.int64)
        counts = np.zeros(len(token_ids), np.int64)
        done = np.zeros(len(token_ids), bool)
        padded = np.concatenate([batch, np.full((len(token_ids), k), PAD, np.int64)], axis=1)
        for n in range(min(self.max_n, width - 1), self.min_n - 1, -1):
            # windows starting at s < width - n: each has at least one token after it
            windows = sliding_window_view(batch[:, :width - 1], n, axis=1)  # [B, width - n, n]
            suffix = batch[:, width - n:]
            hits = (windows == suffix[:, None, :]).all(axis=-1) & (lengths > n)[:, None] & ~done[:, None]
            found = hits.any(axis=1)
            if not found.any():
                continue
            first = np.argmax(hits, axis=1)  # first matching start
            rows = np.flatnonzero(found)
            follow = first[rows] + n  # first token after the match
            take = padded[rows[:, None], follow[:, None] + np.arange(k)[None, :]]
            drafts[rows] = take
            counts[rows] = np.minimum(k, width - follow)
            done |= found
            if done.all():
                break
        return drafts, counts
