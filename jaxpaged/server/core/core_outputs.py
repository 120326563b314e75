"""The engine core's output processing: each step's news as wire deltas, built straight from the sequences.

The core's requests ask for token ids only (`core_params`: no text, no stop
strings, DELTA unless FINAL_ONLY). For the common streaming output (one
sequence, no logprobs) `CoreOutputProcessor` builds the `RequestDelta` the API
server reads directly, instead of a `RequestOutput` and a `CompletionOutput`
that `to_delta` would copy into one: two objects per request per step
instead of four. Every other output (several sequences, logprobs, prompt
logprobs, beam search, final outputs) goes through the engine's own
`OutputProcessor`, whose per-sequence state both paths share, so a request
can take either path on any step.
"""

from __future__ import annotations

from jaxpaged.engine.output_processor import OutputProcessor, _index
from jaxpaged.outputs import RequestOutput, RequestOutputKind
from jaxpaged.sequence import Request, Sequence
from jaxpaged.server.core import messages as M

_FINAL_ONLY, _DELTA = RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA


class CoreOutputProcessor(OutputProcessor):
    """`OutputProcessor` whose streaming outputs are `M.RequestDelta`s; final outputs stay `RequestOutput`s
    (the stat loggers read their metrics) until `to_delta` packs them for the wire."""

    def process(self, advanced: list[Request], finished: list[Request]) -> list[M.RequestDelta | RequestOutput]:
        """As `OutputProcessor.process`, with the streaming outputs in their wire form."""
        outputs: list = []
        streams_of = self._streams_of
        for request in advanced:
            p = request.params
            if p.output_kind is _FINAL_ONLY or request.finish_time is not None or p.beam_width > 1:
                continue
            seqs = request.seqs
            if (len(seqs) == 1 and not request.finished_seqs and p.logprobs is None and not p.detokenize
                    and request.prompt_logprobs is None):
                seq = seqs[0]
                stream = streams_of(request)[seq.index]
                tokens = seq.token_ids
                num_prompt = len(request.prompt_token_ids)
                emitted = stream.num_tokens
                if len(tokens) - num_prompt == emitted:
                    continue  # nothing new (a prefill chunk that sampled nothing yet)
                stream.num_tokens = len(tokens) - num_prompt
                new = tokens[num_prompt + emitted:]
                outputs.append(M.RequestDelta(request.request_id, False, request.num_cached_tokens or 0,
                                              [M.SeqDelta(seq.index, new, seq.cumulative_logprob, None, None, None,
                                                          "", _token_logprobs(seq, len(new)))],
                                              None, None))
                continue
            if request.finished_seqs:
                seqs = sorted(seqs + request.finished_seqs, key=_index)
            output = self._output(request, seqs, finished=False)
            if output is not None:
                outputs.append(to_delta(output))
        for request in finished:
            outputs.append(self._final_output(request))
        return outputs


    def _output(self, request: Request, seqs: list[Sequence], *, finished: bool) -> RequestOutput | None:
        """As `OutputProcessor._output`, with each multi-token delta's token logprobs (see `_token_logprobs`)."""
        output = super()._output(request, seqs, finished=finished)
        if output is not None and request.params.output_kind is _DELTA:
            by_index = {seq.index: seq for seq in seqs}
            for c in output.outputs:
                c.token_logprobs = _token_logprobs(by_index[c.index], len(c.token_ids))
        return output


def _token_logprobs(seq: Sequence, num_new: int) -> list[float] | None:
    """The logprobs of `seq`'s last `num_new` tokens when they are several (a speculating core's step), else None:
    the API server takes those it cuts after a stop string out of the cumulative logprob."""
    return seq.token_logprobs[-num_new:] if num_new > 1 else None


def to_delta(out: RequestOutput | M.RequestDelta) -> M.RequestDelta:
    """A core-side output (token ids only) as its wire form (a wire delta already is)."""
    if isinstance(out, M.RequestDelta):
        return out
    m = out.metrics
    metrics = None if m is None else M.Metrics(m.arrival_time, m.first_scheduled_time, m.first_token_time,
                                               m.finish_time, m.num_preemptions, m.peak_blocks_shared,
                                               m.peak_blocks_unshared, list(m.token_times))
    seqs = [M.SeqDelta(c.index, c.token_ids, c.cumulative_logprob, c.finish_reason, c.stop_reason, c.logprobs, c.text,
                       c.token_logprobs) for c in out.outputs]
    return M.RequestDelta(out.request_id, out.finished, out.num_cached_tokens, seqs, metrics, out.prompt_logprobs)
