"""The online benchmark's HTTP driver: SSE parsing, chunk timing, and the async driver over a mock transport."""

import asyncio
import json

import httpx
import pytest

from jaxpaged.bench.online.datasets import BenchRequest
from jaxpaged.bench.online.online_client import (CompletionStream, RequestResult, completion_body, run_requests,
                                                 sse_events)


def events(lines):
    async def collect():
        async def feed():
            for line in lines:
                yield line
        return [payload async for payload in sse_events(feed())]
    return asyncio.run(collect())


def test_sse_decoder_splits_events_and_ignores_comments_and_other_fields():
    lines = [": keep-alive", "data: {\"a\": 1}", "", "event: x", "id: 7", "data:{\"b\": 2}\r\n", "\r\n",
             "data: first", "data:  second", "", "", ":", "data: [DONE]"]  # the last event has no blank line after it
    assert events(lines) == ['{"a": 1}', '{"b": 2}', "first\n second", "[DONE]"]
    assert events([]) == [] and events(["", ""]) == []


def chunk(text, finish=None, usage=None):
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": choices, "usage": usage})


USAGE = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11, "prompt_tokens_details": {"cached_tokens": 3}}


def feed(payloads_at, start=10.0):
    result = RequestResult("r", prompt_len=99, start_time=start)
    stream = CompletionStream(result)
    for payload, now in payloads_at:
        stream.on_payload(payload, now)
    return stream, result


def test_completion_stream_times_content_chunks_and_reads_usage():
    stream, r = feed([(chunk("ab"), 10.5), (chunk(""), 10.7), (chunk("c", "length"), 11.0),
                      (chunk(None, usage=USAGE), 11.2), ("[DONE]", 11.3)])
    stream.finish()
    assert r.success and r.error == ""
    assert r.ttft == pytest.approx(0.5)
    assert r.itl == pytest.approx([0.2, 0.3])  # an empty-text content chunk still counts as a chunk
    assert r.latency == pytest.approx(1.0) == pytest.approx(r.ttft + sum(r.itl))  # usage chunk and [DONE] don't count
    assert (r.text, r.finish_reason) == ("abc", "length")
    assert (r.output_tokens, r.prompt_len, r.cached_tokens) == (4, 7, 3)


def test_completion_stream_reads_chat_deltas():
    delta = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"},
                                     "finish_reason": "stop"}]})
    stream, r = feed([(delta, 10.1), ("[DONE]", 10.2)])
    stream.finish()
    assert r.success and r.text == "hi" and r.finish_reason == "stop" and r.output_tokens is None


@pytest.mark.parametrize("payloads, match", [
    ([(chunk("a"), 10.1)], "before data: \\[DONE\\]"),
    ([(chunk(None, usage=USAGE), 10.1), ("[DONE]", 10.2)], "no content chunk"),
])
def test_completion_stream_finish_refuses_incomplete_streams(payloads, match):
    stream, r = feed(payloads)
    with pytest.raises(ValueError, match=match):
        stream.finish()
    assert not r.success


@pytest.mark.parametrize("payload, match", [
    ('{"error": {"message": "boom", "type": "internal"}}', "error chunk.*boom"),
    ("not json", "not JSON"), ("[1, 2]", "not a JSON object")])
def test_completion_stream_rejects_error_and_garbage_chunks(payload, match):
    with pytest.raises(ValueError, match=match):
        feed([(payload, 10.1)])


def test_completion_body():
    body = completion_body(BenchRequest("x", [1, 2], 2, 5, cache_salt="t0"), "tiny")
    assert body == {"model": "tiny", "prompt": [1, 2], "max_tokens": 5, "temperature": 0.0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}, "cache_salt": "t0"}
    assert "cache_salt" not in completion_body(BenchRequest("y", "text", 1, 1), "tiny", ignore_eos=False)


class FakeServer:
    """An async handler for httpx.MockTransport that streams one chunk per requested token."""

    def __init__(self, chunk_delay_s=0.002):
        self.chunk_delay_s = chunk_delay_s
        self.in_flight = 0
        self.peak = 0
        self.bodies = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if body["max_tokens"] > 100:
            return httpx.Response(400, json={"error": {"message": "max_tokens too large", "param": "max_tokens"}})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self._stream(body))

    async def _stream(self, body):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            n = body["max_tokens"]
            for i in range(n):
                await asyncio.sleep(self.chunk_delay_s)
                yield f"data: {chunk('x', 'length' if i == n - 1 else None)}\n\n".encode()
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": n}
            yield f"data: {chunk(None, usage=usage)}\n\ndata: [DONE]\n\n".encode()
        finally:
            self.in_flight -= 1


def bench_requests(lengths):
    return [BenchRequest(f"q{i}", [1] * (i + 2), i + 2, n) for i, n in enumerate(lengths)]


def test_run_requests_over_a_mock_server_records_every_request():
    server = FakeServer()
    done = []
    requests = bench_requests([3, 5, 1, 200])
    results, duration = run_requests("http://test", "tiny", requests, [0.0, 0.0, 0.01, 0.02],
                                     transport=httpx.MockTransport(server), on_done=done.append)
    assert [r.request_id for r in results] == ["q0", "q1", "q2", "q3"] and len(done) == 4
    for r, request in zip(results[:3], requests):
        assert r.success, r.error
        assert r.output_tokens == request.output_len and r.text == "x" * request.output_len
        assert len(r.itl) == request.output_len - 1
        assert r.latency == pytest.approx(r.ttft + sum(r.itl))
        assert r.prompt_len == request.prompt_len
    bad = results[3]
    assert not bad.success and bad.error.startswith("HTTP 400") and "max_tokens too large" in bad.error
    assert duration >= max(r.start_time + r.latency for r in results[:3]) - min(r.start_time for r in results)
    assert all(b["model"] == "tiny" and b["stream"] for b in server.bodies)


def test_run_requests_honours_max_concurrency_and_arrival_order():
    server = FakeServer()
    requests = bench_requests([4] * 6)
    offsets = [0.0, 0.0, 0.0, 0.0, 0.03, 0.03]
    results, _ = run_requests("http://test", "tiny", requests, offsets, max_concurrency=2,
                              transport=httpx.MockTransport(server))
    assert all(r.success for r in results)
    assert server.peak == 2
    starts = [r.start_time for r in results]
    assert min(starts[4:]) - min(starts) >= 0.03  # sent no earlier than their arrival offset


def test_run_requests_records_connection_failures():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    results, _ = run_requests("http://test", "tiny", bench_requests([2]), [0.0], transport=httpx.MockTransport(refuse))
    assert not results[0].success and results[0].error == "ConnectError: connection refused"


def test_run_requests_validates_arguments():
    with pytest.raises(ValueError, match="max_concurrency"):
        run_requests("http://test", "tiny", bench_requests([1]), [0.0], max_concurrency=0)
    with pytest.raises(ValueError, match="arrival offsets"):
        run_requests("http://test", "tiny", bench_requests([1, 1]), [0.0])
