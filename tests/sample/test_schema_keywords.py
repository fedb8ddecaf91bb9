"""Which JSON-schema keywords the grammar holds the output to, checked against the installed xgrammar: each
keyword ``schema_keywords`` calls unenforced lets through a value that breaks it (were one enforced some day,
this says to take it off the list), and the keywords it leaves alone are enforced."""

import json

import pytest

from eyas.sample.schema_keywords import UNENFORCED, unenforced

xgr = pytest.importorskip("xgrammar", reason="xgrammar comes with eyas[serve]")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
BROKEN = {  # keyword -> (a schema using it, valid JSON that breaks the schema through that keyword alone)
    "if": ({**OBJ, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, '{"a": 1}'),
    "not": ({"type": "integer", "not": {"const": 3}}, "3"),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1, 2]"),
    "dependentRequired": ({**OBJ, "dependentRequired": {"a": ["b"]}}, '{"a": 1}'),
    "dependentSchemas": ({**OBJ, "dependentSchemas": {"a": {"required": ["b"]}}}, '{"a": 1}'),
    "dependencies": ({**OBJ, "dependencies": {"a": ["b"]}}, '{"a": 1}'),
    "allOf": ({"allOf": [{**OBJ, "required": ["a"]}, {**OBJ, "required": ["b"]}]}, '{"a": 1}'),
}
HELD = [  # what the grammar does enforce: a schema and a value that breaks it
    ({"type": "integer", "multipleOf": 3}, "4"), ({"type": "string", "minLength": 3}, '"ab"'),
    ({"type": "string", "pattern": "^a+$"}, '"b"'), ({"type": "string", "format": "date"}, '"nope"'),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}, '{"a": 1}'),
    ({"type": "object", "propertyNames": {"pattern": "^a"}, "additionalProperties": {"type": "integer"}}, '{"b": 1}'),
    ({"enum": [1, 2]}, "3"), ({"$defs": {"n": {"type": "integer"}}, "allOf": [{"$ref": "#/$defs/n"}]}, '"x"'),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "1.5"),
]


def _lets_through(schema, value: str) -> bool:
    return accepts(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False), value)


@pytest.mark.parametrize("keyword", sorted(set(UNENFORCED) | {"allOf"}))
def test_each_keyword_called_unenforced_lets_a_breaking_value_through(keyword):
    schema, value = BROKEN[keyword]
    assert _lets_through(schema, value), f"xgrammar now enforces {keyword!r}: take it off schema_keywords.UNENFORCED"
    assert [k for _, k in unenforced(schema)] == [keyword]


@pytest.mark.parametrize("schema, value", HELD)
def test_the_keywords_left_alone_are_enforced(schema, value):
    assert not _lets_through(schema, value) and unenforced(schema) == []


def test_the_walk_finds_nested_keywords_and_not_property_names():
    schema = {"type": "object", "properties": {"not": {"type": "string"}, "tags": {
        "type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "$defs": {"x": {"anyOf": [{"type": "integer", "not": {"const": 0}}]}}}
    assert unenforced(schema) == [("#/properties/tags", "uniqueItems"), ("#/$defs/x/anyOf/0", "not")]
