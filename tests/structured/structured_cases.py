"""JSON schemas, regexes and choices for the structured-output tests: every one terminates under random weights.

Strings have a `maxLength` (or an enum, pattern or format) and arrays a
`maxItems`, so a random model's output ends within the tests' `max_tokens`.
"""

S = {"type": "string", "maxLength": 6}
I = {"type": "integer", "minimum": -50, "maximum": 50}

SCHEMAS = [
    {"type": "boolean"},
    {"type": "null"},
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"type": "integer", "minimum": -1000, "maximum": 1000},
    {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20},
    {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25},
    {"type": "string", "maxLength": 5},
    {"type": "string", "minLength": 2, "maxLength": 4},
    {"enum": ["red", "green", "blue"]},
    {"const": "fixed"},
    {"type": "string", "pattern": "^[a-z]{1,5}-[0-9]{2}$"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "ipv4"},
    {"type": "string", "format": "email", "maxLength": 20},
    {"type": "array", "items": I, "maxItems": 4},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
    {"type": "array", "items": {"enum": ["x", "y", 1, None]}, "maxItems": 5},
    {"type": "array", "prefixItems": [S, I], "items": False},
    {"type": "object", "properties": {"a": I}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": S},
     "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"x": I, "y": I},
                                                "required": ["x", "y"], "additionalProperties": False}},
     "required": ["inner"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": I, "tag": {"enum": ["a", "b"]}}, "required": ["id", "tag"],
        "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False},
    {"anyOf": [I, S]},
    {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"v": I}, "required": ["v"],
                                  "additionalProperties": False}]},
    {"oneOf": [{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 3}]},
    {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
    {"type": "object", "properties": {"kind": {"const": "point"}, "coords": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 2}},
     "required": ["kind", "coords"], "additionalProperties": False},
    {"$defs": {"leaf": {"type": "object", "properties": {"v": I}, "required": ["v"],
                        "additionalProperties": False}},
     "type": "object", "properties": {"left": {"$ref": "#/$defs/leaf"}, "right": {"$ref": "#/$defs/leaf"}},
     "required": ["left", "right"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed"]}, "count": I,
                                      "labels": {"type": "array", "items": S, "maxItems": 2}},
     "required": ["status", "count", "labels"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "boolean"}}, "required": ["c"], "additionalProperties": False}}, "required": ["b"],
        "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 10,
                                                "multipleOf": 0.5}}, "required": ["price"],
     "additionalProperties": False},
    {"allOf": [{"type": "object", "properties": {"p": I}, "required": ["p"]},
               {"type": "object", "properties": {"q": {"type": "boolean"}}, "required": ["q"]}],
     "additionalProperties": False, "properties": {"p": I, "q": {"type": "boolean"}}},
]

REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no|maybe)", r"[A-Z][a-z]{0,6}", r"[0-9]{1,4}\.[0-9]{2}", r"(ab|cd){1,3}e?",
           r"[a-f0-9]{8}"]

CHOICES = [["yes", "no"], ["alpha", "beta", "gamma"], ["ü", "ß", "世界"]]
