"""A fuzzer over the whole HTTP surface of the live split server (`jaxpaged serve`, tiny model).

Bodies are generated from the request schemas themselves (the pydantic
models of `jaxpaged/server/protocol.py`): each field gets a value of its
declared type or, often, a hostile one (integers far outside 64 bits, NaN
and infinities, wrong types, deep nesting, lone surrogates), fields go
missing, and whole bodies come as other JSON values or not as JSON at all.
Every route gets them, plus unknown paths and wrong methods. Every answer
must be a 2xx, or a 4xx in the OpenAI error shape; a stream must end with
`[DONE]`; never a 5xx or a dropped connection. Afterwards nothing is left
running and a reference greedy request gives the tokens it gave before.
"""

import collections
import json
import types
import typing

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from jaxpaged.server import protocol
from tests.server.live_server import WAIT_S, free_port, keep_draining, start_server, wait_healthy, wait_idle

BODY_LIMIT = 256 * 1024
ROUTES = {  # POST routes and the schema of their body
    "/v1/completions": protocol.CompletionRequest,
    "/v1/chat/completions": protocol.ChatCompletionRequest,
    "/tokenize": protocol.TokenizeRequest,
    "/detokenize": protocol.DetokenizeRequest,
    "/v1/cache/pin": protocol.PinRequest,
}
OTHER_ROUTES = [("POST", "/reset_prefix_cache"), ("GET", "/health"), ("GET", "/v1/models"), ("GET", "/metrics"),
                ("GET", "/v1/completions"), ("DELETE", "/v1/chat/completions"), ("POST", "/v1/nothing"),
                ("GET", "/../../etc/passwd")]
REFERENCE = {"prompt": [9, 8, 7, 6, 5], "max_tokens": 8, "temperature": 0, "ignore_eos": True}

HUGE_INTS = [-1, 300, 2**31 - 1, 2**31, 2**63, 2**64, 2**70, -(2**63) - 1, -(2**70), 10**400]  # out of some range
json_scalars = (st.none() | st.booleans() | st.integers(-5, 300) | st.sampled_from(HUGE_INTS)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
                | st.sampled_from(["", "tiny", "\ud800", "\x00", "a" * 3000]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


@st.composite
def deeply_nested(draw):
    """A list or object nested 200 to 5,000 levels deep (the deep end past Python's default recursion limit)."""
    depth = draw(st.integers(200, 5000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    return _Raw(opener * depth + "0" + closer * depth)


class _Raw(str):
    """JSON text spliced into a body as it is (json.dumps cannot build a value nested this deep)."""


hostile = json_values | deeply_nested()


def for_type(tp) -> st.SearchStrategy:
    """Values of the declared type `tp` (pydantic's field annotations): mostly small ones that a request can
    use on the tiny model, now and then ones out of range."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return for_type(args[0])
    if origin in (typing.Union, types.UnionType):
        return st.one_of([for_type(a) for a in args])
    if origin is list:
        return st.lists(for_type(args[0]), min_size=1, max_size=5)  # [] is among the hostile values
    if origin is dict:
        return st.dictionaries(st.sampled_from(["1", "2", "300", "-1", "x"]) if args[0] is str else for_type(args[0]),
                               for_type(args[1]), max_size=3)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if tp is type(None):
        return st.none()
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return body_of(tp)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return _mostly(st.integers(0, 12), st.sampled_from(HUGE_INTS))
    if tp is float:
        return _mostly(st.floats(0, 1), st.floats(-3, 3) | st.sampled_from([float("nan"), float("inf"), -1e308,
                                                                            1e-45]))
    if tp is str:
        return st.text(max_size=16) | st.sampled_from(["tiny", "user", "assistant", "text"])
    return json_values  # `object`, `dict` without arguments


FIELDS = {  # values that let a body through more often than a random one of the type would
    "model": st.sampled_from([None, "tiny"]),
    "max_tokens": st.integers(-1, 12),
    "max_completion_tokens": st.integers(-1, 12),
    "role": st.sampled_from(["user", "assistant", "system"]),
}


def _mostly(usual: st.SearchStrategy, rare: st.SearchStrategy) -> st.SearchStrategy:
    """`usual` four times in five, else `rare`."""
    return st.integers(0, 4).flatmap(lambda k: rare if k == 0 else usual)


def body_of(model: type[BaseModel]) -> st.SearchStrategy:
    """A body of `model`: its required fields (each missing now and then) and up to two optional ones, each
    with a value of its declared type, or one time in five a hostile value."""
    fields = {name: _mostly(FIELDS[name] if name in FIELDS else for_type(f.annotation), hostile)
              for name, f in model.model_fields.items()}
    required = sorted(n for n, f in model.model_fields.items() if f.is_required())
    optional = sorted(set(fields) - set(required))

    @st.composite
    def build(draw):
        chosen = {n for n in required if draw(st.integers(0, 9)) > 0}
        chosen |= set(draw(st.lists(st.sampled_from(optional), max_size=2, unique=True)))
        return {name: draw(fields[name]) for name in sorted(chosen)}
    return build()


def encode(body) -> bytes:
    """JSON bytes of `body`, with any `_Raw` text spliced in (NaN and infinities as Python writes them)."""
    spliced = {}

    def stand_in(value):
        if isinstance(value, _Raw):
            key = f"__raw{len(spliced)}__"
            spliced[key] = value
            return key
        if isinstance(value, list):
            return [stand_in(v) for v in value]
        if isinstance(value, dict):
            return {k: stand_in(v) for k, v in value.items()}
        return value

    text = json.dumps(stand_in(body))
    for key, raw in spliced.items():
        text = text.replace(json.dumps(key), raw)
    return text.encode("utf-8", "surrogatepass")


schema_requests = st.sampled_from(sorted(ROUTES)).flatmap(
    lambda path: st.tuples(st.just("POST"), st.just(path), body_of(ROUTES[path]).map(encode)))
other_requests = st.one_of(
    st.tuples(st.just("POST"), st.sampled_from(sorted(ROUTES)), hostile.map(encode)),  # any JSON at all
    st.tuples(st.just("POST"), st.sampled_from(sorted(ROUTES)), st.binary(max_size=64)),  # not JSON
    st.sampled_from(OTHER_ROUTES).map(lambda r: (r[0], r[1], b"")),
)
requests = _mostly(schema_requests, other_requests)


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = start_server("--host=127.0.0.1", f"--port={port}", "--engine_core=process", "--kv_budget_tokens=2048",
                        "--max_model_len=128", "--max_num_seqs=4", "--max_waiting_requests=16",
                        f"--max_request_body_bytes={BODY_LIMIT}")
    keep_draining(proc)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, [proc])
    with httpx.Client(base_url=base, timeout=WAIT_S) as client:
        yield client
    proc.terminate()
    proc.wait(timeout=60)


def _reference(client: httpx.Client) -> str:
    response = client.post("/v1/completions", json=REFERENCE)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def _check_answer(response: httpx.Response, body: bytes) -> None:
    """A 2xx (a stream ends with [DONE]), or a 4xx whose body is an OpenAI error object."""
    status = response.status_code
    assert status < 500 and (200 <= status < 300 or 400 <= status < 500), (status, response.text[:500], body[:300])
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status, response.text
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line for line in response.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "data: [DONE]", response.text[-500:]
        for event in events[:-1]:
            assert "error" not in json.loads(event[len("data: "):]), event


def test_every_route_answers_2xx_or_an_openai_4xx(server):
    before = _reference(server)
    answered = []

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(requests)
    def one_request(request):
        method, path, body = request
        try:
            response = server.request(method, path, content=body, headers={"content-type": "application/json"})
        except httpx.TransportError as error:  # a dropped connection is a failure too
            pytest.fail(f"{method} {path} {body[:300]!r}: {error!r}")
        answered.append((path, response.status_code))
        _check_answer(response, body)

    one_request()
    print("answers:", collections.Counter(answered))
    after = wait_idle(str(server.base_url))  # nothing running or waiting, and no token being generated
    assert after["jaxpaged:kv_cache_usage_perc"] == 0
    assert server.get("/health").status_code == 200
    assert _reference(server) == before
