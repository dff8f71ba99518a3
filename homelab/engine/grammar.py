"""JSON output through grammars: JSON schema → GBNF, with bounds on what a client may send.

A schema or grammar arrives from the network. llama.cpp's grammar parser recurses on nested
groups and its sampler walks every alternative for every token, so both size and nesting are
bounded here before anything reaches C: a schema at most :data:`MAX_SCHEMA_CHARS` long and
:data:`MAX_SCHEMA_DEPTH` deep, a grammar at most :data:`MAX_GRAMMAR_CHARS` long with groups
nested at most :data:`MAX_GRAMMAR_NESTING` deep. Violations raise :class:`EngineError` with a
message the server can return as a 400.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from homelab.errors import EngineError

MAX_SCHEMA_CHARS = 32 * 1024
MAX_SCHEMA_DEPTH = 12
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_GRAMMAR_NESTING = 64  # schema-made grammars nest ~16 deep (bounded-repetition numbers)

# Any JSON object (OpenAI's response_format {"type": "json_object"}).
JSON_OBJECT_GRAMMAR = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
"""


def schema_depth(value: object) -> int:
    """Nesting depth of a JSON value (a scalar is 0, ``{}`` is 1)."""
    depth, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            children: list[Any] = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        depth = max(depth, level + 1)
        stack.extend((child, level + 1) for child in children)
    return depth


def schema_to_grammar(schema: Mapping[str, Any] | str) -> str:
    """A GBNF grammar that accepts exactly the JSON documents ``schema`` describes."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise EngineError(
            f"the JSON schema is {len(text)} characters; at most {MAX_SCHEMA_CHARS} are accepted",
            hint="Send a smaller schema.",
        )
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineError(f"the JSON schema is not valid JSON: {exc}") from exc
    if schema_depth(parsed) > MAX_SCHEMA_DEPTH:
        raise EngineError(
            f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels",
            hint="Flatten the schema.",
        )
    from homelab.llamacpp.grammar import json_schema_to_gbnf

    grammar = json_schema_to_gbnf(text)
    check_grammar(grammar)
    return grammar


def grammar_nesting(grammar: str) -> int:
    """Deepest ``(`` group nesting, ignoring quoted literals, character classes and comments."""
    depth = deepest = 0
    index, length = 0, len(grammar)
    while index < length:
        char = grammar[index]
        if char in '"[':
            index = _skip_literal(grammar, index, '"' if char == '"' else "]")
        elif char == "#":
            newline = grammar.find("\n", index)
            index = length if newline < 0 else newline
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
        index += 1
    return deepest


def _skip_literal(text: str, start: int, closer: str) -> int:
    index = start + 1
    while index < len(text) and text[index] != closer:
        index += 2 if text[index] == "\\" else 1
    return index


def check_grammar(grammar: str) -> None:
    """Raise EngineError when a GBNF grammar is too large or too deeply nested."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise EngineError(
            f"the grammar is {len(grammar)} characters; at most {MAX_GRAMMAR_CHARS} are accepted",
            hint="Send a smaller grammar or schema.",
        )
    if grammar_nesting(grammar) > MAX_GRAMMAR_NESTING:
        raise EngineError(
            f"the grammar nests groups deeper than {MAX_GRAMMAR_NESTING} levels",
            hint="Simplify the grammar.",
        )
