"""The API server's half of output processing: the core's token ids become text, and stop strings end requests.

The core runs every request with `detokenize=False` and no stop strings (token
ids only, DELTA outputs unless the client asked for FINAL_ONLY without stop
strings). Here each request is mirrored by a small `Request`-shaped record fed
with the core's deltas, and the engine's own `OutputProcessor` builds the
client's outputs from it, so text, the held-back tail of a streaming stop
string and the output kinds are exactly what the in-process engine produces.
A stop string found here finishes its sequence ("stop") and drops the tokens
after the one that completed it (a delta carries several tokens when the core
speculates); once no sequence of the request runs, the caller aborts it in
the core (the core may have sampled a token or two more meanwhile; they are
dropped). Beam search is the one
exception: its final texts are decoded in the core (one decode per beam).
"""

from __future__ import annotations

import dataclasses
import time

from jaxpaged.engine.output_processor import OutputProcessor
from jaxpaged.outputs import CompletionOutput, RequestMetrics, RequestOutput, RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.core import messages as M


class _Seq:
    """What `OutputProcessor` reads of a `Sequence`."""

    __slots__ = ("index", "token_ids", "finish_reason", "stop_reason", "cumulative_logprob", "logprobs",
                 "delta_logprobs")

    def __init__(self, index: int, prompt_token_ids: list[int], with_logprobs: bool) -> None:
        self.index, self.token_ids = index, list(prompt_token_ids)
        self.finish_reason = self.stop_reason = None
        self.cumulative_logprob = 0.0
        self.delta_logprobs: list[float] | None = None  # the last delta's token logprobs, when it had several
        self.logprobs = [] if with_logprobs else None


class _Request:
    """What `OutputProcessor` reads of a `Request` (the metrics fields are filled from the core's final output)."""

    __slots__ = ("request_id", "params", "prompt", "prompt_token_ids", "seqs", "finished_seqs", "finish_time",
                 "num_cached_tokens", "arrival_time", "first_scheduled_time", "first_token_time",
                 "num_preemptions", "peak_blocks_shared", "peak_blocks_unshared", "token_times", "prompt_logprobs")

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams):
        self.request_id, self.params, self.prompt, self.prompt_token_ids = request_id, params, prompt, prompt_token_ids
        self.seqs = [_Seq(i, prompt_token_ids, params.logprobs is not None) for i in range(params.n)]
        self.finished_seqs: list[_Seq] = []
        self.finish_time = self.first_scheduled_time = self.first_token_time = None
        self.num_cached_tokens = 0
        self.arrival_time = time.monotonic()
        self.num_preemptions = self.peak_blocks_shared = self.peak_blocks_unshared = 0
        self.token_times: list[float] = []
        self.prompt_logprobs: list | None = [] if params.prompt_logprobs is not None else None


def core_params(params: SamplingParams) -> SamplingParams:
    """What the core runs for a client's `params`: token ids only, stop strings left to the front end."""
    if params.beam_width > 1:
        return params  # one final output; the core decodes its beams' texts
    kind = params.output_kind
    if kind is not RequestOutputKind.FINAL_ONLY or params.stop:
        kind = RequestOutputKind.DELTA
    return dataclasses.replace(params, detokenize=False, stop=(), include_stop_str_in_output=False,
                               output_kind=kind)


class FrontendOutputs:
    """Per request being served through this API server: its mirror, fed by the core's deltas."""

    def __init__(self, tokenizer) -> None:
        self._processor = OutputProcessor(lambda: tokenizer)
        self._requests: dict[str, _Request] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            prompt: str | None = None) -> None:
        """Start mirroring a request the core has accepted."""
        self._requests[request_id] = _Request(request_id, prompt, prompt_token_ids, params)

    def drop(self, request_id: str) -> None:
        """Forget a request (its client left); later deltas for it are ignored."""
        self._requests.pop(request_id, None)

    def apply(self, delta: M.RequestDelta) -> tuple[list[RequestOutput], bool]:
        """The client's outputs for one core delta, and whether a stop string just ended the request
        (the caller then aborts it in the core)."""
        request = self._requests.get(delta.request_id)
        if request is None:
            return [], False
        request.num_cached_tokens = delta.num_cached_tokens
        if delta.prompt_logprobs and request.prompt_logprobs is not None:
            request.prompt_logprobs.extend(delta.prompt_logprobs)
        if request.params.beam_width > 1:
            del self._requests[delta.request_id]
            return [_beam_output(request, delta)], False
        running = {s.index: s for s in request.seqs}
        for d in delta.seqs:
            seq = running.get(d.index)
            if seq is None:
                continue  # stopped here already; the core had not heard yet
            seq.token_ids.extend(d.token_ids)
            seq.cumulative_logprob, seq.delta_logprobs = d.cumulative_logprob, d.token_logprobs
            if d.logprobs is not None and seq.logprobs is not None:
                seq.logprobs.extend(d.logprobs)
            if d.finish_reason is not None:
                seq.finish_reason, seq.stop_reason = d.finish_reason, d.stop_reason
                _finish(request, seq)
        for seq, stop, num_tokens in self._processor.find_stop_strings([request]):
            # a delta of several tokens (speculative decoding) may run past the stop: drop the tokens after it
            num_dropped = len(seq.token_ids) - len(request.prompt_token_ids) - num_tokens
            if num_dropped and seq.delta_logprobs is not None:  # and their logprobs from the cumulative one
                seq.cumulative_logprob -= sum(seq.delta_logprobs[-num_dropped:])
            del seq.token_ids[len(request.prompt_token_ids) + num_tokens:]
            if seq.logprobs is not None:
                del seq.logprobs[num_tokens:]
            seq.finish_reason, seq.stop_reason = "stop", stop
            _finish(request, seq)
        stopped_here = not request.seqs and not delta.finished
        finished = []
        if delta.finished or not request.seqs:
            _set_metrics(request, delta.metrics)
            finished.append(request)
            del self._requests[delta.request_id]
            for seq in request.seqs:  # the core finished it (aborted): every running sequence ends with it
                seq.finish_reason = seq.finish_reason or "abort"
                request.finished_seqs.append(seq)
            request.seqs = []
        return self._processor.process([request], finished), stopped_here


def _finish(request: _Request, seq: _Seq) -> None:
    request.seqs.remove(seq)
    request.finished_seqs.append(seq)


def _set_metrics(request: _Request, m: M.Metrics | None) -> None:
    request.finish_time = time.monotonic()
    if m is None:
        return
    request.arrival_time, request.first_scheduled_time, request.first_token_time = (
        m.arrival_time, m.first_scheduled_time, m.first_token_time)
    request.finish_time, request.num_preemptions = m.finish_time, m.num_preemptions
    request.peak_blocks_shared, request.peak_blocks_unshared = m.peak_blocks_shared, m.peak_blocks_unshared
    request.token_times = m.token_times


def _beam_output(request: _Request, delta: M.RequestDelta) -> RequestOutput:
    _set_metrics(request, delta.metrics)
    m = delta.metrics
    metrics = None if m is None else RequestMetrics(*(getattr(m, f) for f in m.__struct_fields__))
    completions = [CompletionOutput(d.index, d.token_ids, d.text, d.cumulative_logprob, d.finish_reason, d.logprobs,
                                    d.stop_reason) for d in delta.seqs]
    return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, completions, True,
                         delta.num_cached_tokens, metrics, request.prompt_logprobs)
