"""The decode side of a disaggregated deployment: a simulated runner whose pulled K/V costs no compute.

A decode instance receives a request whose prompt was prefilled elsewhere:
the K/V of the prompt's full blocks that it did not already cache travelled
over the link (`jaxpaged.sim.kv_link`) before the request was submitted. The
engine's scheduler and KV cache manager treat the request as any other: it is
admitted with its local prefix hit, gets blocks for the rest of its prompt,
computes that rest in one step (the decode instance's token budget holds a
whole prompt) and caches its full blocks afterwards, as a pulled block would
be cached. Only the cost differs: `PulledKVRunner` leaves the pulled token
positions out of that step's work, so the step costs what the decode device
really computes, the prompt's tail after the last full block (at least its
last token, whose logits give the first output token; vLLM's decode side
recomputes it too).

A span is used once, by the first step that schedules any of its positions;
if the request is preempted afterwards it recomputes them like any request. If a
block counted as locally cached when the pull started was evicted before the
request was admitted, the decode instance recomputes it (counted as work).
"""

from __future__ import annotations

from jaxpaged.config import ModelConfig
from jaxpaged.scheduler.output import SchedulerOutput
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.runner import SimClock, SimulatedRunner


def uncovered_chunks(num_tokens: int, start: int, span: tuple[int, int]) -> list[tuple[int, int]]:
    """The parts of the chunk `[start, start + num_tokens)` outside `span` (`[a, b)`), as
    `(num_tokens, start)` pairs in position order."""
    a, b = span
    end = start + num_tokens
    pieces = []
    if start < a:
        pieces.append((min(end, a) - start, start))
    if end > b:
        first = max(start, b)
        pieces.append((end - first, first))
    return pieces


class PulledKVRunner(SimulatedRunner):
    """`SimulatedRunner` for a decode instance: token spans announced by `expect_pull` cost nothing."""

    def __init__(self, config: ModelConfig, cost_model: CostModel, clock: SimClock, *, num_blocks: int):
        super().__init__(config, cost_model, clock, num_blocks=num_blocks)
        self._pulled: dict[str, tuple[int, int]] = {}  # request id -> positions [a, b) whose K/V arrived
        self.pulled_tokens = 0  # positions the steps left out
        self.recomputed_tokens = 0  # prompt positions computed here that were neither cached nor pulled

    def expect_pull(self, request_id: str, start: int, end: int) -> None:
        """Positions `[start, end)` of `request_id`'s prompt arrive with it: its first step skips them."""
        if not 0 <= start <= end:
            raise ValueError(f"a pulled span needs 0 <= start <= end, got [{start}, {end})")
        self._pulled[request_id] = (start, end)

    def computed_chunks(self, scheduler_output: SchedulerOutput) -> list[tuple[int, int]]:
        """Each sequence's chunk less its request's pulled span (the first time it is scheduled)."""
        if not self._pulled:
            return super().computed_chunks(scheduler_output)
        chunks = []
        for seq, n, c in zip(scheduler_output.seqs, scheduler_output.num_tokens, scheduler_output.starts):
            span = self._pulled.pop(seq.request.request_id, None)
            if span is None:
                chunks.append((n, c))
                continue
            pieces = uncovered_chunks(n, c, span)
            computed = sum(k for k, _ in pieces)
            self.pulled_tokens += n - computed
            # before the span: blocks counted as cached here when the pull started, evicted since
            self.recomputed_tokens += sum(k for k, s in pieces if s < span[0])
            chunks.extend(pieces)
        return chunks

    @property
    def num_pending_pulls(self) -> int:
        """Requests whose pulled span no step has used yet."""
        return len(self._pulled)
