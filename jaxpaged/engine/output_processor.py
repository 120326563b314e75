"""Output processing: the scheduler's advanced and finished requests become `RequestOutput`s.

Per request it remembers how many tokens of each sequence it has handed out
and, for streamed text, an incremental detokenizer per sequence, so a DELTA
output carries exactly the tokens and text that are new since the request's
previous output, and a CUMULATIVE one everything so far.

Stop strings are matched here, on the detokenized text, after every step
(`find_stop_strings`): the engine finishes the sequences that hit one. The text
is cut before the stop string, and while a sequence streams, its last
`len(longest stop) - 1` characters are held back, so no part of a stop string
is ever handed out.
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
    num_chars: int = 0  # characters of text handed out (DELTA)
    num_logprobs: int = 0  # logprob entries handed out (DELTA)
    searched: int = 0  # characters of text already searched for stop strings
    stop_text: str | None = None  # the whole text, cut at the stop string it hit


class OutputProcessor:
    """Builds each step's outputs, per request as its `SamplingParams.output_kind` asks."""

    def __init__(self, tokenizer: Callable[[], object]):
        """`tokenizer()` returns the tokenizer; called only when text is needed."""
        self._tokenizer = tokenizer
        self._streams: dict[str, list[_Stream]] = {}  # per streaming request, one per sequence index
        self._prompt_logprobs_sent: dict[str, int] = {}  # DELTA requests: prompt logprob entries handed out

    def find_stop_strings(self, advanced: list[Request]) -> list[tuple[Sequence, str, int]]:
        """Detokenize the new tokens of requests with stop strings; returns the (sequence, stop, tokens) hits.

        The caller finishes those sequences ("stop"); their text ends before
        the stop string (or with it, with `include_stop_str_in_output`).
        `tokens` is how many output tokens it took for the stop string to
        appear: a step that appended several tokens at once (speculative
        decoding in an engine core that leaves stop strings to the API
        server) may have gone past it, and the caller drops the tokens after.
        """
        hits = []
        for request in advanced:
            p = request.params
            if not p.stop or request.finish_time is not None:
                continue
            streams = self._streams_of(request)
            num_prompt = len(request.prompt_token_ids)
            for seq in request.seqs:
                stream = streams[seq.index]
                if stream.stop_text is not None:
                    continue
                detok = self._detokenizer(stream)
                found = None
                for t in seq.token_ids[num_prompt + len(detok.ids):]:
                    detok.push(t)
                    found = _find_stop(detok.text, p.stop, stream.searched)
                    stream.searched = len(detok.text)
                    if found is not None and len(detok.ids) < p.min_tokens:
                        found = None  # no stop string before min_tokens tokens (vLLM): that text is not searched again
                    if found is not None:
                        break
                if found is not None:
                    at, stop = found
                    stream.stop_text = detok.text[:at + len(stop) if p.include_stop_str_in_output else at]
                    hits.append((seq, stop, len(detok.ids)))
        return hits

    def process(self, advanced: list[Request], finished: list[Request]) -> list[RequestOutput]:
        """One output per streaming request that has something new, then one per finished request.

        Streaming outputs carry `metrics=None`; the final output carries the request's metrics.
        """
        outputs = []
        for request in advanced:
            p = request.params
            if p.output_kind is FINAL_ONLY or request.finish_time is not None or p.beam_width > 1:
                continue
            seqs = request.seqs
            if request.finished_seqs:
                seqs = sorted(seqs + request.finished_seqs, key=_index)
            output = self._output(request, seqs, finished=False)
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
            output.metrics = _metrics(request)
        self._streams.pop(request.request_id, None)
        output.prompt_logprobs = self._prompt_logprobs(request)
        self._prompt_logprobs_sent.pop(request.request_id, None)
        # A sequence points at its request and the request at its sequences: break that cycle, so
        # reference counting frees them now instead of the cyclic GC (whole token lists) later.
        request.finished_seqs = []
        return output

    def _output(self, request: Request, seqs: list[Sequence], *, finished: bool) -> RequestOutput | None:
        """The request's output now; None (unless `finished`) when none of its sequences has anything new."""
        p = request.params
        delta = p.output_kind is DELTA
        num_prompt = len(request.prompt_token_ids)
        streams = self._streams_of(request)
        completions = []
        anything_new = finished
        for seq in seqs:
            stream = streams[seq.index]
            token_ids = seq.token_ids
            emitted = stream.num_tokens
            seq_finished = seq.finish_reason is not None
            if len(token_ids) - num_prompt == emitted and seq_finished == stream.finished:
                if delta:
                    continue  # nothing new for this sequence
            else:
                anything_new = True
            text = self._text(p, stream, token_ids, num_prompt, flush=seq_finished) if p.detokenize else ""
            stream.num_tokens, stream.finished = len(token_ids) - num_prompt, seq_finished
            logprobs = seq.logprobs
            if logprobs is not None and delta:
                logprobs, stream.num_logprobs = logprobs[stream.num_logprobs:], len(logprobs)
            completions.append(CompletionOutput(seq.index, token_ids[num_prompt + emitted if delta else num_prompt:],
                                                text, seq.cumulative_logprob, seq.finish_reason,
                                                None if logprobs is None else list(logprobs), seq.stop_reason))
        if not anything_new:
            return None  # a prefill chunk that sampled nothing yet
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, completions,
                             finished, request.num_cached_tokens or 0, None,
                             None if finished else self._prompt_logprobs(request))

    def _prompt_logprobs(self, request: Request) -> list | None:
        """The request's prompt logprobs so far (DELTA: those not handed out yet)."""
        entries = request.prompt_logprobs
        if entries is None:
            return None
        if request.params.output_kind is not DELTA:
            return list(entries)
        sent = self._prompt_logprobs_sent.get(request.request_id, 0)
        self._prompt_logprobs_sent[request.request_id] = len(entries)
        return entries[sent:]

    def _text(self, p, stream: _Stream, token_ids: list[int], num_prompt: int, *, flush: bool) -> str:
        """The text to hand out now: all of it, or (DELTA) the new part."""
        if p.output_kind is FINAL_ONLY and not p.stop:
            return self._tokenizer().decode(token_ids[num_prompt:])
        if stream.stop_text is not None:
            text = stream.stop_text
        else:
            detok = self._detokenizer(stream)
            for t in token_ids[num_prompt + len(detok.ids):]:
                detok.push(t)
            if flush:
                detok.flush()
            text = detok.text
            if p.stop and not flush and not p.include_stop_str_in_output:
                text = text[:max(len(text) - (max(map(len, p.stop)) - 1), stream.num_chars)]  # hold back
        if p.output_kind is DELTA:
            new, stream.num_chars = text[stream.num_chars:], len(text)
            return new
        stream.num_chars = len(text)
        return text

    def _streams_of(self, request: Request) -> list[_Stream]:
        streams = self._streams.get(request.request_id)
        if streams is None:
            streams = self._streams[request.request_id] = [_Stream() for _ in range(request.params.n)]
        return streams

    def _detokenizer(self, stream: _Stream) -> IncrementalDetokenizer:
        if stream.detokenizer is None:
            stream.detokenizer = IncrementalDetokenizer(self._tokenizer())
        return stream.detokenizer

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


def _index(seq: Sequence) -> int:
    return seq.index


def _find_stop(text: str, stops: tuple[str, ...], searched: int) -> tuple[int, str] | None:
    """The earliest stop string in `text` that ends past `searched`, as (where it starts, which one)."""
    best = None
    for stop in stops:
        at = text.find(stop, max(searched - len(stop) + 1, 0))
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    return best
