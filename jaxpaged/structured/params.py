"""StructuredOutputsParams: which constraint a request's output must satisfy (vLLM 0.32's shape)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

MAX_CHOICES = 4096  # the most alternatives a `choice` constraint may list
MAX_CONSTRAINT_CHARS = 1 << 20  # a schema, regex or grammar longer than this (as text) is refused


@dataclasses.dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one constraint on a request's output text.

    `json`: a JSON schema (a dict or its JSON text) the output must validate
    against; `json_object`: any JSON object; `regex`: a regular expression the
    whole output must match; `choice`: one of these strings exactly;
    `grammar`: a Lark grammar (llguidance's dialect) or a GBNF/EBNF grammar.
    `disable_any_whitespace` makes JSON output compact (no whitespace between
    tokens), as vLLM's flag does; `disable_additional_properties` treats an
    object schema without `additionalProperties` as closed.

    Checked on construction: ValueError naming the field. Whether the
    constraint compiles is checked when the request is added
    (`jaxpaged.structured.grammar`).
    """

    json: dict | str | None = dataclasses.field(default=None, hash=False)
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    def __post_init__(self):
        """Check that exactly one constraint is given and its type (ValueError naming the field)."""
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs needs exactly one of json, regex, choice, grammar, json_object; "
                             f"got {', '.join(given) if given else 'none'}")
        for flag in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"structured_outputs.{flag} must be a boolean, got {getattr(self, flag)!r}")
        if self.json is not None:
            object.__setattr__(self, "json", _json_schema(self.json))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
            if value is not None and len(value) > MAX_CONSTRAINT_CHARS:
                raise ValueError(f"structured_outputs.{name} is {len(value)} characters; at most "
                                 f"{MAX_CONSTRAINT_CHARS}")
        if self.choice is not None:
            object.__setattr__(self, "choice", _choices(self.choice))
        if self.json_object is not None and self.json_object is not True:
            raise ValueError(f"structured_outputs.json_object must be true when given, got {self.json_object!r}")

    @property
    def kind(self) -> str:
        """Which constraint this is: "json", "json_object", "regex", "choice" or "grammar"."""
        for name in ("json", "regex", "choice", "grammar"):
            if getattr(self, name) is not None:
                return name
        return "json_object"


def _json_schema(schema: Any) -> dict | bool:
    """The schema as a JSON value (a dict, or a boolean schema); ValueError on bad JSON or type."""
    if isinstance(schema, str):
        if len(schema) > MAX_CONSTRAINT_CHARS:
            raise ValueError(f"structured_outputs.json is {len(schema)} characters; at most {MAX_CONSTRAINT_CHARS}")
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"structured_outputs.json is not valid JSON: {err}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"structured_outputs.json must be a JSON schema object, got {type(schema).__name__}")
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as err:
        raise ValueError(f"structured_outputs.json is not serialisable as JSON: {err}") from None
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise ValueError(f"structured_outputs.json is {len(text)} characters; at most {MAX_CONSTRAINT_CHARS}")
    return schema


def _choices(choices: Any) -> tuple[str, ...]:
    if isinstance(choices, str) or not isinstance(choices, (list, tuple)):
        raise ValueError(f"structured_outputs.choice must be a list of strings, got {choices!r}")
    if not choices:
        raise ValueError("structured_outputs.choice must list at least one string")
    if len(choices) > MAX_CHOICES:
        raise ValueError(f"structured_outputs.choice lists {len(choices)} strings; at most {MAX_CHOICES}")
    for c in choices:
        if not isinstance(c, str) or not c:
            raise ValueError(f"structured_outputs.choice must hold non-empty strings, got {c!r}")
    return tuple(choices)


def closed_objects(schema):
    """The schema with `additionalProperties: false` on every object schema that does not say otherwise."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
