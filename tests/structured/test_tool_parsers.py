"""Tool calling without a server: the three families' output formats, the plans of each tool_choice, and the
messages a chat template sees (independent references: the expected calls written out by hand)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from jaxpaged.server.chat import ChatTemplate
from jaxpaged.server.protocol import ChatMessage
from jaxpaged.server.tools import (parse_hermes, parse_llama3_json, parse_mistral, parser_for_template, plan_tools,
                                   required_calls_schema, template_messages)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}}


def _calls(parsed):
    content, calls = parsed
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def test_hermes_calls_with_leading_content():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {"zone": "cet"}}</tool_call>')
    assert _calls(parse_hermes(text)) == ("Let me check.", [("get_weather", {"city": "Paris"}),
                                                             ("get_time", {"zone": "cet"})])
    assert _calls(parse_hermes("no calls here")) == ("no calls here", [])
    broken = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    assert _calls(parse_hermes(broken)) == (broken, [])  # malformed: the text comes back as content


def test_llama3_json_calls():
    assert _calls(parse_llama3_json('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}')) == \
        (None, [("get_weather", {"city": "Rome"})])
    text = '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {"zone": "utc"}}'
    assert _calls(parse_llama3_json(text)) == (None, [("get_weather", {"city": "Oslo"}),
                                                      ("get_time", {"zone": "utc"})])
    assert _calls(parse_llama3_json("The weather is fine.")) == ("The weather is fine.", [])


def test_mistral_calls_with_and_without_the_marker():
    text = 'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Lyon"}}]'
    assert _calls(parse_mistral(text)) == ("Sure.", [("get_weather", {"city": "Lyon"})])
    bare = '[{"name": "get_time", "arguments": {"zone": "utc"}}, {"name": "get_weather", "arguments": {"city": "Bonn"}}]'
    assert _calls(parse_mistral(bare)) == (None, [("get_time", {"zone": "utc"}), ("get_weather", {"city": "Bonn"})])
    assert _calls(parse_mistral("[1, 2]")) == ("[1, 2]", [])


def test_parser_follows_the_chat_template():
    assert parser_for_template("... [TOOL_CALLS] ...") == "mistral"
    assert parser_for_template("{{ '<|python_tag|>' }}") == "llama3_json"
    assert parser_for_template("<tool_call>\n{{ tool_call | tojson }}\n</tool_call>") == "hermes"


def test_plans_of_each_tool_choice():
    kw = dict(template_source="", structured_outputs_requested=False)
    assert plan_tools(None, None, True, **kw) is None
    assert plan_tools([], "auto", True, **kw) is None  # an empty list is no tools (vLLM)
    assert plan_tools([WEATHER], None, True, **kw).mode == "auto"
    assert plan_tools([WEATHER], "none", True, **kw).constraint is None
    named = plan_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, True, **kw)
    assert named.mode == "named" and named.constraint.json == TIME["function"]["parameters"]
    required = plan_tools([WEATHER, TIME], "required", False, **kw)
    schema = required.constraint.json
    assert schema == required_calls_schema({"get_weather": WEATHER["function"]["parameters"],
                                            "get_time": TIME["function"]["parameters"]}, parallel=False)
    jsonschema.validate([{"name": "get_time", "parameters": {"zone": "utc"}}], schema)
    for bad in ([], [{"name": "get_time", "parameters": {"zone": "utc"}}] * 2,
                [{"name": "get_time", "parameters": {"city": "x"}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


@pytest.mark.parametrize("tools, choice, message", [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "not in tools"),
    ([WEATHER], "sometimes", "tool_choice must be"),
    (None, "required", "tool_choice needs tools"),
    ([{"type": "function", "function": {}}], "auto", r"tools\[0\].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "auto", "parameters must be"),
])
def test_bad_tool_requests_name_the_field(tools, choice, message):
    with pytest.raises(ValueError, match=message):
        plan_tools(tools, choice, True, template_source="", structured_outputs_requested=False)
    with pytest.raises(ValueError, match="cannot be combined"):
        plan_tools([WEATHER], "required", True, template_source="", structured_outputs_requested=True)


def test_tool_messages_reach_the_template():
    source = ("{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
              "{% for m in messages %}{{ m.role }}:"
              "{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }} "
              "{{ c.function.arguments.city }}{% endfor %}{% endif %}"
              "{% if m.role == 'tool' %}[{{ m.tool_call_id }}]{% endif %}{{ m.content }}\n{% endfor %}")
    messages = [ChatMessage(role="user", content="weather?"),
                ChatMessage(role="assistant", content=None, tool_calls=[
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]),
                ChatMessage(role="tool", content="sunny", tool_call_id="c1")]
    text = ChatTemplate(source).render(template_messages(messages), tools=[WEATHER], add_generation_prompt=False)
    assert text == "TOOL get_weather\nuser:weather?\nassistant:CALL get_weather Paris\ntool:[c1]sunny\n"


@pytest.mark.parametrize("parser, text, ready", [
    ("hermes", "Hello there", 11),
    ("hermes", "Hello <tool", 6),  # "<tool" may become "<tool_call>": held back
    ("hermes", "Hi <tool_call>{", 3),
    ("hermes", "a < b", 5),
    ("llama3_json", '{"name', 0),
    ("llama3_json", "<|python", 0),
    ("llama3_json", "The answer", 10),
    ("mistral", "[{", 0),
    ("mistral", "Sure [TOOL_CALLS] [", 5),
    ("mistral", "Sure [TOOL", 5),
])
def test_streamable_content_holds_back_what_may_start_a_call(parser, text, ready):
    from jaxpaged.server.tools import streamable_content
    assert streamable_content(parser, text) == ready


def test_strict_functions_close_their_objects():
    loose = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}}}}}
    strict = {"type": "function", "function": {**loose["function"], "strict": True}}
    kw = dict(template_source="", structured_outputs_requested=False)
    named = {"type": "function", "function": {"name": "f"}}
    jsonschema.validate({"a": {"b": 1}, "extra": 1}, plan_tools([loose], named, True, **kw).constraint.json)
    closed = plan_tools([strict], named, True, **kw).constraint.json
    jsonschema.validate({"a": {"b": 1}}, closed)
    for extra in ({"a": {"b": 1}, "extra": 1}, {"a": {"b": 1, "c": 2}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(extra, closed)


@pytest.mark.parametrize("choice", [{"type": "function", "function": ["f"]}, {"type": "function"},
                                    {"function": {"name": "get_weather"}}])
def test_malformed_named_choices_are_value_errors(choice):
    with pytest.raises(ValueError, match="tool_choice must be"):
        plan_tools([WEATHER], choice, True, template_source="", structured_outputs_requested=False)


@pytest.mark.parametrize("call", [{"function": ["x"]}, {"function": {"arguments": "{}"}}, {}])
def test_malformed_tool_calls_in_messages_are_value_errors(call):
    with pytest.raises(ValueError, match="a tool call needs a 'function' object"):
        template_messages([ChatMessage(role="assistant", content=None, tool_calls=[call])])
