"""The JSON-schema keywords a grammar cannot hold the output to: ``unenforced(schema)``.

xgrammar (0.2.x) compiles a schema's types, properties, required keys, enums, consts, ``$ref``, ``anyOf``
and ``oneOf`` (as ``anyOf``), string lengths, patterns and most formats, number bounds and ``multipleOf``,
array bounds and ``prefixItems``, property counts and names. It compiles but does not enforce the keywords
below: each relates parts of the value that a left-to-right grammar cannot tie together, so a schema that
uses one gets output that may break it (``tests/sample/test_schema_keywords.py`` checks each against the
installed xgrammar). The server refuses such a schema rather than return JSON that fails its validator.
"""

from __future__ import annotations

# keyword -> what it asks that the grammar does not hold the output to
UNENFORCED = {
    "if": "a condition on the value (if / then / else)",
    "not": "a value that must not match a schema",
    "uniqueItems": "array items that differ from each other",
    "contains": "an array with an item matching a schema",
    "dependentRequired": "keys required by other keys",
    "dependentSchemas": "schemas applied when a key is present",
    "dependencies": "keys required by other keys",
}
_ONE = ("items", "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
        "unevaluatedProperties", "unevaluatedItems", "additionalItems")  # keywords whose value is one schema
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")  # lists of schemas (``items`` too, in older drafts)


def unenforced(schema, at: str = "#") -> list[tuple[str, str]]:
    """``(JSON pointer, keyword)`` of each keyword in ``schema`` that the grammar does not enforce, and of each
    ``allOf`` of more than one schema (xgrammar does not hold the output to every member of the conjunction)."""
    if not isinstance(schema, dict):
        return []
    found = [(at, k) for k in schema if k in UNENFORCED]
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        found.append((at, "allOf"))
    for k in _ONE:
        found += unenforced(schema.get(k), f"{at}/{k}")
    for k in _MAP:
        if isinstance(schema.get(k), dict):
            for name, sub in schema[k].items():
                found += unenforced(sub, f"{at}/{k}/{name}")
    for k in _LIST + ("items",):
        if isinstance(schema.get(k), list):
            for i, sub in enumerate(schema[k]):
                found += unenforced(sub, f"{at}/{k}/{i}")
    return found
