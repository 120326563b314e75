"""OpenAI tool calling for `/v1/chat/completions`: `tools`, `tool_choice`, `parallel_tool_calls`, as vLLM 0.32 serves them.

- `tool_choice="none"`: the tools are still given to the chat template (vLLM's
  default) and the output is plain content.
- `"auto"` (the default when tools are given): the output is free, then parsed
  by the served family's tool-call format (`ToolParser`): Hermes-style
  `<tool_call>{json}</tool_call>` (Qwen, SmolLM2, and the default), Llama 3's
  JSON (`<|python_tag|>` or a bare `{"name": ..., "parameters": ...}`), and
  Mistral's `[TOOL_CALLS] [...]`. The format is read off the chat template's
  source (which marker it writes).
- `"required"`: the output is constrained by a JSON schema to a list of at
  least one `{"name": <a tool>, "parameters": <its schema>}` (at most one
  without `parallel_tool_calls`), and every element becomes a call.
- a named function (`{"type": "function", "function": {"name": ...}}`): the
  output is constrained to that function's `parameters` schema and is the
  call's `arguments`. Both constraints write compact JSON (no free whitespace),
  and a function with `strict: true` gets its objects closed
  (`additionalProperties: false` where the schema does not say otherwise).

A call comes back as `{"id", "type": "function", "function": {"name",
"arguments": <JSON text>}}`; the finish reason is "tool_calls" when `auto` or
`required` produced calls, and stays "stop" for a named function (vLLM's
rule).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any

from jaxpaged.structured import StructuredOutputsParams
from jaxpaged.structured.params import closed_objects


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = dataclasses.field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex}")

    def to_dict(self) -> dict:
        """The OpenAI `tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """How a chat request uses its tools: the mode, its output constraint, and the format to parse."""

    mode: str  # "none", "auto", "required" or "named"
    tools: tuple[dict, ...]  # the request's `tools`, as given (rendered by the chat template)
    named: str | None = None  # the function of a named tool_choice
    constraint: StructuredOutputsParams | None = None
    parser: str = "hermes"


def plan_tools(tools: list | None, tool_choice: Any, parallel_tool_calls: bool, *, template_source: str,
               structured_outputs_requested: bool) -> ToolPlan | None:
    """The request's tool plan (None without tools, an empty list included); ValueError naming the field."""
    if tools is not None and not isinstance(tools, list):
        raise ValueError("tools must be a list of {'type': 'function', 'function': {...}} objects")
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice needs tools")
        return None
    functions = {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" \
                or not isinstance(tool.get("function"), dict):
            raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}")
        name = tool["function"].get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        parameters = tool["function"].get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        strict = tool["function"].get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"tools[{i}].function.strict must be a boolean, got {strict!r}")
        # strict (OpenAI's structured function calling): objects that do not say otherwise are closed
        functions[name] = closed_objects(parameters) if strict else parameters
    choice = "auto" if tool_choice is None else tool_choice
    parser = parser_for_template(template_source)
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise ValueError("tool_choice must be 'none', 'auto', 'required' or "
                             "{'type': 'function', 'function': {'name': ...}}")
        if name not in functions:
            raise ValueError(f"tool_choice names function {name!r}, which is not in tools")
        mode = "named"
    elif choice in ("none", "auto", "required"):
        mode, name = choice, None
    else:
        raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}")
    if mode in ("named", "required") and structured_outputs_requested:
        raise ValueError(f"tool_choice {mode!r} cannot be combined with response_format or guided decoding")
    constraint = None
    # compact JSON: arguments are read by programs, and free whitespace lets a weak model ramble to max_tokens
    if mode == "named":
        constraint = StructuredOutputsParams(json=functions[name], disable_any_whitespace=True)
    elif mode == "required":
        constraint = StructuredOutputsParams(json=required_calls_schema(functions, parallel_tool_calls),
                                             disable_any_whitespace=True)
    return ToolPlan(mode, tuple(tools), name, constraint, parser)


def required_calls_schema(functions: dict[str, dict], parallel: bool) -> dict:
    """The JSON schema of `tool_choice="required"`: a list of calls, each a tool's name and parameters."""
    calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
              "required": ["name", "parameters"], "additionalProperties": False}
             for name, params in functions.items()]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls} if len(calls) > 1 else calls[0]}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def parser_for_template(source: str) -> str:
    """The tool-call format a chat template's model writes: "mistral", "llama3_json" or "hermes"."""
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3_json"
    return "hermes"


def parse_output(plan: ToolPlan, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a finished output under `plan`."""
    if plan.mode == "none":
        return text, []
    if plan.mode == "named":
        return None, [ToolCall(plan.named, _compact(text))]
    if plan.mode == "required":
        try:
            calls = json.loads(text)
        except json.JSONDecodeError:
            return text, []  # cut by max_tokens
        return None, [ToolCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]
    return PARSERS[plan.parser](text)


def _compact(text: str) -> str:
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except json.JSONDecodeError:
        return text  # cut by max_tokens: the client gets what was generated


def _call_of(obj: Any, arguments_key: str = "arguments") -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(arguments_key, obj.get("arguments", obj.get("parameters", {})))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen, SmolLM2, Hermes)."""
    if "<tool_call>" not in text:
        return text, []
    calls = []
    for body in _HERMES.findall(text):
        try:
            call = _call_of(json.loads(body))
        except json.JSONDecodeError:
            call = None
        if call is None:
            return text, []  # malformed: hand the text back as content, as vLLM does
        calls.append(call)
    content = text[:text.index("<tool_call>")].strip()
    return content or None, calls


def parse_llama3_json(text: str) -> tuple[str | None, list[ToolCall]]:
    """Llama 3's JSON calls: `<|python_tag|>` or a bare `{"name": ..., "parameters": {...}}`, `;`-separated."""
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].lstrip()
    if not body.startswith("{"):
        return text, []
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            obj, end = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            return text, []
        call = _call_of(obj, "parameters")
        if call is None:
            return text, []
        calls.append(call)
        at = end
        while at < len(body) and body[at] in " \n\t;":
            at += 1
    return None, calls


def parse_mistral(text: str) -> tuple[str | None, list[ToolCall]]:
    """Mistral's `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (the marker may be decoded away)."""
    marker = text.find("[TOOL_CALLS]")
    content, body = (text[:marker].strip(), text[marker + len("[TOOL_CALLS]"):].strip()) if marker >= 0 \
        else ("", text.strip())
    if marker < 0 and not body.startswith("[{"):
        return text, []
    try:
        objs = json.JSONDecoder().raw_decode(body)[0]
    except json.JSONDecodeError:
        return text, []
    calls = [_call_of(o) for o in (objs if isinstance(objs, list) else [objs])]
    if not calls or any(c is None for c in calls):
        return text, []
    return content or None, calls


PARSERS = {"hermes": parse_hermes, "llama3_json": parse_llama3_json, "mistral": parse_mistral}
_MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3_json": "<|python_tag|>"}


def streamable_content(parser: str, text: str) -> int:
    """How many leading characters of a partial `auto` output are surely content (no call starts in them).

    Text before a call marker is content; a tail that could still become the
    marker is held back, and so is everything once the output may be a bare
    JSON call (Llama 3's `{...}`, Mistral's `[{...}]` without its marker).
    """
    marker = _MARKERS[parser]
    stripped = text.lstrip()
    if parser == "llama3_json" and (stripped.startswith("{") or marker.startswith(stripped[:len(marker)])):
        return 0
    if parser == "mistral" and stripped.startswith("["):
        at = stripped.find(marker)
        return 0 if at <= 0 else len(text) - len(stripped) + at  # "[TOOL_CALLS]" itself starts with "["
    at = text.find(marker)
    if at >= 0:
        return at
    for keep in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-keep:]):
            return len(text) - keep
    return len(text)


def template_messages(messages) -> list[dict]:
    """The request's messages as the chat template reads them: `tool` results with their call id, and the
    assistant's earlier `tool_calls` with `arguments` as an object (as Hugging Face templates expect)."""
    out = []
    for m in messages:
        entry: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            calls = []
            for call in m.tool_calls:
                function = call.get("function")
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise ValueError("messages: a tool call needs a 'function' object with a 'name'")
                function = dict(function)
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except json.JSONDecodeError:
                        raise ValueError("messages: a tool call's arguments are not valid JSON") from None
                calls.append({**call, "function": function})
            entry["tool_calls"] = calls
        if m.tool_call_id is not None:
            entry["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            entry["name"] = m.name
        out.append(entry)
    return out
