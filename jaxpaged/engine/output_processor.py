"""Output processing: the scheduler's advanced and finished requests become `RequestOutput`s.

Per request it remembers how many tokens of each sequence it has handed out
and, for streamed text, an incremental detokenizer per sequence, so a DELTA
output carries exactly the tokens and text that are new since the request's
previous output, and a CUMULATIVE one everything so far.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jaxpaged.outputs import CompletionOutput, RequestMetrics, RequestOutput, RequestOutputKind
from jaxpaged.scheduler.beam import best_beams
from jaxpaged.sequence import Request, Sequence
from jaxpaged.tokenizer import IncrementalDetokenizer

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY


@dataclasses.dataclass(slots=True)
class _Stream:
    """What one sequence has handed out so far."""

    num_tokens: int = 0
    finished: bool = False  # its finish reason has been handed out
    detokenizer: IncrementalDetokenizer | None = None


class OutputProcessor:
    """Builds each step's outputs, per request as its `SamplingParams.output_kind` asks."""

    def __init__(self, tokenizer: Callable[[], object]):
        """`tokenizer()` returns the tokenizer; called only when text is needed."""
        self._tokenizer = tokenizer
        self._streams: dict[str, dict[int, _Stream]] = {}

    def process(self, advanced: list[Request], finished: list[Request]) -> list[RequestOutput]:
        """One output per advanced request that streams (unless it finished), then one per finished request."""
        outputs = []
        for request in advanced:
            p = request.params
            if p.output_kind is FINAL_ONLY or p.beam_width > 1 or request.finish_time is not None:
                continue
            output = self._output(request, sorted(request.seqs + request.finished_seqs, key=_index),
                                  finished=False)
            if output is not None:
                outputs.append(output)
        for request in finished:
            outputs.append(self._final_output(request))
        return outputs

    def _final_output(self, request: Request) -> RequestOutput:
        if request.params.beam_width > 1:
            output = self._beam_output(request)
        else:
            output = self._output(request, sorted(request.finished_seqs, key=_index), finished=True)
        self._streams.pop(request.request_id, None)
        # A sequence points at its request and the request at its sequences: break that cycle, so
        # reference counting frees them now instead of the cyclic GC (whole token lists) later.
        request.finished_seqs = []
        return output

    def _output(self, request: Request, seqs: list[Sequence], *, finished: bool) -> RequestOutput | None:
        """The request's output now; None (unless `finished`) when none of its sequences has anything new."""
        p = request.params
        delta = p.output_kind is DELTA
        num_prompt = len(request.prompt_token_ids)
        streams = self._streams.setdefault(request.request_id, {})
        if not finished and not any(_is_new(streams.get(seq.index), seq, num_prompt) for seq in seqs):
            return None  # a prefill chunk that sampled nothing yet
        completions = []
        for seq in seqs:
            stream = streams.get(seq.index)
            if stream is None:
                stream = streams[seq.index] = _Stream()
            total = len(seq.token_ids) - num_prompt
            seq_finished = seq.finish_reason is not None
            if delta and not _is_new(stream, seq, num_prompt):
                continue  # nothing new for this sequence
            token_ids = seq.token_ids[num_prompt + (stream.num_tokens if delta else 0):]
            text = self._text(p, stream, seq.token_ids, num_prompt, flush=seq_finished)
            stream.num_tokens, stream.finished = total, seq_finished
            completions.append(CompletionOutput(index=seq.index, token_ids=token_ids, text=text,
                                                cumulative_logprob=seq.cumulative_logprob,
                                                finish_reason=seq.finish_reason))
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, completions,
                             finished=finished, num_cached_tokens=request.num_cached_tokens or 0,
                             metrics=_metrics(request))

    def _text(self, p, stream: _Stream, token_ids: list[int], num_prompt: int, *, flush: bool) -> str:
        """The text to hand out now: all of it, or (DELTA) the new part; "" without detokenize."""
        if not p.detokenize:
            return ""
        if p.output_kind is FINAL_ONLY:
            return self._tokenizer().decode(token_ids[num_prompt:])
        if stream.detokenizer is None:
            stream.detokenizer = IncrementalDetokenizer(self._tokenizer())
        detok = stream.detokenizer
        new_text = "".join([detok.push(t) for t in token_ids[num_prompt + len(detok.ids):]])
        if flush:
            new_text += detok.flush()
        return new_text if p.output_kind is DELTA else detok.text

    def _beam_output(self, request: Request) -> RequestOutput:
        p = request.params
        tokenizer = self._tokenizer() if p.detokenize else None
        completions = []
        for rank, s in enumerate(best_beams(request)):
            token_ids = s.output_token_ids
            completions.append(CompletionOutput(index=rank, token_ids=token_ids,
                                                text=tokenizer.decode(token_ids) if tokenizer else "",
                                                cumulative_logprob=s.cumulative_logprob,
                                                finish_reason=s.finish_reason))
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, completions,
                             finished=True, num_cached_tokens=request.num_cached_tokens or 0,
                             metrics=_metrics(request))


def _metrics(request: Request) -> RequestMetrics:
    return RequestMetrics(request.arrival_time, request.first_scheduled_time, request.first_token_time,
                          request.finish_time, request.num_preemptions, request.peak_blocks_shared,
                          request.peak_blocks_unshared, request.token_times)


def _is_new(stream: _Stream | None, seq: Sequence, num_prompt: int) -> bool:
    """Whether the sequence has tokens or a finish reason it has not handed out."""
    if stream is None:
        return len(seq.token_ids) > num_prompt or seq.finish_reason is not None
    return len(seq.token_ids) - num_prompt != stream.num_tokens or (seq.finish_reason is not None) != stream.finished


def _index(seq: Sequence) -> int:
    return seq.index
