"""Structured output over HTTP: one live server (engine core in its own process), the official `openai` client.

Every constrained output is checked against an independent reference
(jsonschema, `re.fullmatch`, pydantic through `beta.chat.completions.parse`).
Constraints that do not compile, or two at once, are 400s in the OpenAI error
shape before anything streams, and the next request is served.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.live_server import WAIT_S, serving
from tests.structured.structured_cases import SCHEMAS

MAX_TOKENS = 160


@pytest.fixture(scope="module")
def server():
    yield from serving("--kv_budget_tokens=4096", "--max_model_len=512")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


class Pet(BaseModel):
    kind: str = Field(pattern="^(cat|dog|fish)$")
    legs: int = Field(ge=0, le=4)


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    pets: list[Pet] = Field(max_length=2)


def test_beta_parse_with_a_pydantic_model(client):
    for seed in range(3):
        completion = client.beta.chat.completions.parse(
            model="tiny", messages=[{"role": "user", "content": "Describe a person as JSON."}],
            response_format=Person, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed,
            )
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "stop", message.content
        assert isinstance(message.parsed, Person)
        assert Person.model_validate_json(message.content) == message.parsed


@pytest.mark.parametrize("field, value, check", [
    ("guided_json", SCHEMAS[23], lambda text: jsonschema.validate(json.loads(text), SCHEMAS[23])),
    ("guided_regex", r"[0-9]{3}-[a-z]{2}", lambda text: re.fullmatch(r"[0-9]{3}-[a-z]{2}", text) or 1 / 0),
    ("guided_choice", ["left", "right"], lambda text: text in ("left", "right") or 1 / 0),
    ("guided_grammar", 'root ::= "<" [xy]{1,4} ">"', lambda text: re.fullmatch(r"<[xy]{1,4}>", text) or 1 / 0),
    ("structured_outputs", {"json": SCHEMAS[29], "disable_any_whitespace": True},
     lambda text: jsonschema.validate(json.loads(text), SCHEMAS[29])),
    ("response_format", {"type": "json_object"}, lambda text: json.loads(text).keys()),
])
def test_each_field_constrains_completions_streamed_and_not(client, field, value, check):
    for stream in (False, True):
        kwargs = dict(model="tiny", prompt="x", max_tokens=MAX_TOKENS, temperature=0.8, seed=5)
        body = {field: value}
        if field == "response_format":
            # any JSON object: keys and strings are unbounded, so a random model is nudged to close them
            bias = {str(ord(c)): 8 for c in '}"'}
            response = client.chat.completions.create(messages=[{"role": "user", "content": "json"}],
                                                      response_format=value, stream=stream, logit_bias=bias, **{
                                                          k: v for k, v in kwargs.items() if k != "prompt"})
            text = "".join(c.choices[0].delta.content or "" for c in response) if stream \
                else response.choices[0].message.content
        else:
            response = client.completions.create(stream=stream, extra_body=body, **kwargs)
            text = "".join(c.choices[0].text for c in response) if stream else response.choices[0].text
        check(text)


def test_min_p_and_allowed_token_ids(client):
    allowed = [ord(c) for c in "ab"]
    out = client.completions.create(model="tiny", prompt="x", max_tokens=12, temperature=1.0, seed=1,
                                    extra_body={"allowed_token_ids": allowed, "min_p": 0.05, "ignore_eos": True})
    assert set(out.choices[0].text) <= {"a", "b"} and len(out.choices[0].text) == 12


@pytest.mark.parametrize("body, message", [
    ({"guided_regex": "(unclosed"}, "regex does not compile"),
    ({"guided_json": {"type": "object", "properties": {"a": {"type": "wrong"}}}}, "json does not compile"),
    ({"guided_grammar": "root ::= nowhere"}, "grammar does not compile"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "only one kind of structured output"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"structured_outputs": {"regex": "a", "backend": "x"}}, "unsupported field 'backend'"),
    ({"guided_choice": []}, "at least one"),
    ({"allowed_token_ids": [99999]}, "allowed_token_ids entry 99999"),
    ({"min_p": 2}, "min_p"),
])
def test_bad_constraints_are_400s_before_anything_streams(server, body, message):
    for stream in (False, True):
        response = httpx.post(server + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 4,
                                                                "stream": stream, **body}, timeout=WAIT_S)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == 400 and message in error["message"], error
    ok = httpx.post(server + "/v1/completions", json={"model": "tiny", "prompt": "ok", "max_tokens": 2},
                    timeout=WAIT_S)
    assert ok.status_code == 200


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _check_calls(calls, allowed=("get_weather", "get_time")):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id and call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


@pytest.mark.parametrize("stream", [False, True])
def test_named_and_required_tool_choice_are_enforced(client, stream):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, parallel, reason in ((named, True, "stop"), ("required", False, "tool_calls"),
                                     ("required", True, "tool_calls")):
        kwargs = dict(model="tiny", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                      parallel_tool_calls=parallel, max_tokens=MAX_TOKENS, temperature=1.0, seed=3)
        if stream:
            with client.beta.chat.completions.stream(**kwargs) as events:
                completion = events.get_final_completion()
        else:
            completion = client.chat.completions.create(**kwargs)
        first = completion.choices[0]
        assert first.finish_reason == reason
        _check_calls(first.message.tool_calls, ("get_weather",) if choice is named else ("get_weather", "get_time"))
        if not parallel:
            assert len(first.message.tool_calls) == 1


def test_auto_parses_hermes_calls_and_leaves_plain_text_as_content(client):
    plain = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=8,
                                           temperature=0.0, extra_body={"guided_regex": "[a-z ]{1,8}"})
    assert plain.choices[0].message.tool_calls == [] and plain.choices[0].message.content
    assert plain.choices[0].finish_reason in ("stop", "length")
    # a random model writes a call only when made to: the regex forces the Hermes format, auto parses it
    forced = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,5}", "unit": "c"\}\}</tool_call>'
    for stream in (False, True):
        kwargs = dict(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="auto", max_tokens=MAX_TOKENS,
                      temperature=1.0, seed=1, extra_body={"guided_regex": forced})
        if stream:
            with client.beta.chat.completions.stream(**kwargs) as events:
                completion = events.get_final_completion()
        else:
            completion = client.chat.completions.create(**kwargs)
        assert completion.choices[0].finish_reason == "tool_calls"
        _check_calls(completion.choices[0].message.tool_calls, ("get_weather",))
        assert not completion.choices[0].message.content


def test_the_openai_tool_calling_loop(client, server):
    """Call, run the tool, send its result back as a `tool` message, get the answer."""
    messages = list(ASK)
    # one call: a greedy random model would otherwise keep appending calls up to max_tokens
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=MAX_TOKENS, temperature=0.0)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    answer = client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], tool_choice="none",
                                            max_tokens=8, temperature=0.0)
    assert answer.choices[0].message.content is not None and not answer.choices[0].message.tool_calls
    rendered = httpx.post(server + "/tokenize", json={"model": "tiny", "messages": messages}).json()
    text = httpx.post(server + "/detokenize", json={"tokens": rendered["tokens"]}).json()["prompt"]
    assert "<|tool|>\nsunny, 21 C\n" in text  # the tool's result went through the chat template


def test_auto_streams_content_before_a_call(client):
    forced = r'Sure, one moment\. <tool_call>\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,5}", "unit": "f"\}\}</tool_call>'
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=MAX_TOKENS,
                                                 temperature=1.0, seed=2, stream=True,
                                                 extra_body={"guided_regex": forced}))
    content_chunks = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) > 1  # streamed as generated, not held to the end
    assert "".join(content_chunks).strip() == "Sure, one moment."
    calls = [t for c in chunks if c.choices and c.choices[0].delta.tool_calls for t in c.choices[0].delta.tool_calls]
    assert [t.function.name for t in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].function.arguments), PARAMETERS["get_weather"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
