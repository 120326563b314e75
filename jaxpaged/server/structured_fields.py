"""The OpenAI and vLLM request fields that ask for structured output, as one `StructuredOutputsParams`.

Accepted as vLLM 0.32 accepts them: `response_format` (`text`,
`json_object`, `json_schema` with `schema` and `strict`), the extra fields
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, and
`structured_outputs` (an object with `json`, `regex`, `choice`, `grammar`,
`json_object`, `disable_any_whitespace`, `disable_additional_properties`).
At most one of them may constrain a request: two is a ValueError (a 400), as
is a `response_format` type the server does not know. `strict: true` closes
every object of the schema that does not say otherwise (OpenAI's strict
schemas list `additionalProperties: false` themselves). Whether the
constraint compiles is checked by the engine when the request is added,
before anything streams.
"""

from __future__ import annotations

from jaxpaged.structured import StructuredOutputsParams

STRUCTURED_OUTPUTS_KEYS = ("json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace",
                           "disable_additional_properties")


def structured_outputs_of(*, response_format: dict | None, guided_json, guided_regex: str | None,
                          guided_choice: list[str] | None, guided_grammar: str | None,
                          structured_outputs: dict | None) -> StructuredOutputsParams | None:
    """The request's constraint (None: free text); ValueError naming the field when it is malformed."""
    given: list[tuple[str, dict]] = []
    if response_format is not None:
        from_format = _from_response_format(response_format)
        if from_format is not None:
            given.append(("response_format", from_format))
    for name, key, value in (("guided_json", "json", guided_json), ("guided_regex", "regex", guided_regex),
                             ("guided_choice", "choice", guided_choice),
                             ("guided_grammar", "grammar", guided_grammar)):
        if value is not None:
            given.append((name, {key: value}))
    if structured_outputs is not None:
        if not isinstance(structured_outputs, dict):
            raise ValueError("structured_outputs must be an object")
        unknown = sorted(set(structured_outputs) - set(STRUCTURED_OUTPUTS_KEYS))
        if unknown:
            raise ValueError(f"structured_outputs: unsupported field {unknown[0]!r} (supported: "
                             f"{', '.join(STRUCTURED_OUTPUTS_KEYS)})")
        given.append(("structured_outputs", {k: v for k, v in structured_outputs.items() if v is not None}))
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"only one kind of structured output may be requested, got {given[0][0]} and "
                         f"{given[1][0]}")
    name, fields = given[0]
    try:
        return StructuredOutputsParams(**fields)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def _from_response_format(fmt: dict) -> dict | None:
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise ValueError("response_format.json_schema must be an object with a 'schema'")
        schema = spec.get("schema", spec.get("json_schema"))
        if schema is None:
            raise ValueError("response_format.json_schema.schema is required")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"response_format.json_schema.strict must be a boolean, got {strict!r}")
        return {"json": schema, "disable_additional_properties": bool(strict)}
    raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
