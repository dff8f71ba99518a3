"""Calls written as code: Python-style ``[get_weather(city='Paris', days=3)]`` between two
markers (LFM2 ``<|tool_call_start|>…<|tool_call_end|>``), and Gemma 4's
``<|tool_call>call:NAME{city:<|"|>Paris<|"|>}<tool_call|>``.

The list is read with :mod:`ast` (literals only, nothing is evaluated), so a call is known
only once its closing marker arrives: it streams as one start and one arguments fragment.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from homelab.server.tools.formats import (
    PartialCall,
    Scan,
    ToolFormat,
    require_name,
    require_object,
)
from homelab.server.tools.scan import Malformed, read_json
from homelab.server.tools.strict_json import check_json_value
from homelab.server.tools.toolset import ToolSet

MAX_CHARS = 100_000


class ReadWhenClosed(ToolFormat):
    """A region between ``opener`` and ``close``, read whole once the close has come (its
    arguments arrive in one fragment); :meth:`read` turns the body into calls."""

    opener: str
    close: str

    def __post_init__(self) -> None:
        self.openers = (self.opener,)

    def scan(self, region: str, final: bool, tools: ToolSet) -> Scan:
        end = region.find(self.close, len(self.opener))
        if end < 0:
            too_long = len(region) > MAX_CHARS
            return Scan(failed="the call region is not closed" if final or too_long else None)
        return Scan(self.read(region[len(self.opener) : end], tools), end=end + len(self.close))

    def read(self, body: str, tools: ToolSet) -> list[PartialCall]:
        raise NotImplementedError


@dataclass(kw_only=True)
class PythonCalls(ReadWhenClosed):
    name: str
    opener: str
    close: str

    def read(self, body: str, tools: ToolSet) -> list[PartialCall]:
        return [_call(node, tools) for node in _call_nodes(body)]


def _call_nodes(body: str) -> list[ast.Call]:
    try:
        tree = ast.parse(_escape_newlines(body.strip()) or "[]", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Malformed(f"not Python calls: {exc}") from exc
    nodes = tree.elts if isinstance(tree, ast.List | ast.Tuple) else [tree]
    if not all(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) for n in nodes):
        raise Malformed("not a list of calls")
    return [n for n in nodes if isinstance(n, ast.Call)]


def _call(node: ast.Call, tools: ToolSet) -> PartialCall:
    assert isinstance(node.func, ast.Name)
    if node.args or any(k.arg is None for k in node.keywords):
        raise Malformed("Python calls take keyword arguments only")
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        arguments[str(keyword.arg)] = _literal(keyword.value)
    check_json_value(arguments)  # no sets, bytes, ``...``, inf: a literal of JSON's types
    call = PartialCall(require_name(node.func.id, tools), arguments=arguments)
    call.args = json.dumps(arguments, ensure_ascii=False)
    return call


_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.expr, depth: int = 0) -> Any:
    """A Python literal, JSON's ``true``/``false``/``null`` accepted (templates render dict
    arguments with ``tojson`` inside Python-style calls)."""
    if depth > 128:
        raise Malformed("arguments nested too deeply")
    if isinstance(node, ast.Constant) and not isinstance(node.value, bytes | complex):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {
            _key(k, depth): _literal(v, depth + 1)
            for k, v in zip(node.keys, node.values, strict=True)
        }
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal(node.operand, depth + 1)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    raise Malformed("not a literal argument")


def _key(node: ast.expr | None, depth: int) -> str:
    key = _literal(node, depth + 1) if node is not None else None
    if not isinstance(key, str):
        raise Malformed("a dict key is not a string")
    return key


def _escape_newlines(body: str) -> str:
    """Newlines inside quoted strings escaped: templates render a text argument as
    ``'...'`` around its raw text, so the model writes them raw too."""
    out: list[str] = []
    quote: str | None = None
    escaped = False
    for char in body:
        if quote and char == "\n":
            out.append("\\n")
            continue
        out.append(char)
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = quote is not None
        elif char in "'\"" and (quote is None or quote == char):
            quote = None if quote else char
    return "".join(out)


_GEMMA_QUOTE = '<|"|>'
_GEMMA_TOKEN = re.compile(
    r'<\|"\|>(.*?)<\|"\|>|("(?:[^"\\]|\\.)*")|([A-Za-z_][A-Za-z0-9_]*)(\s*:)?|(.)', re.S
)  # Gemma text, a JSON string (a forced call writes JSON), a bare word, anything else
_GEMMA_WORDS = {"True": "true", "False": "false", "None": "null"}


@dataclass(kw_only=True)
class GemmaCalls(ReadWhenClosed):
    """Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`` — bare keys,
    text quoted by ``<|"|>``; read whole when the call closes."""

    name: str = "gemma4"
    opener: str = "<|tool_call>"
    close: str = "<tool_call|>"

    def read(self, body: str, tools: ToolSet) -> list[PartialCall]:
        body = body.strip()
        if not body.startswith("call:") or "{" not in body:
            raise Malformed("not a Gemma call")
        name, arguments = body[5:].split("{", 1)
        call = PartialCall(require_name(name.strip(), tools))
        value = read_json(_gemma_json("{" + arguments))
        call.arguments = require_object(value)
        call.args = json.dumps(call.arguments, ensure_ascii=False)
        return [call]


def _gemma_json(text: str) -> str:
    """Gemma's argument object as JSON: quoted text, quoted keys, Python words as JSON's."""
    out: list[str] = []
    for match in _GEMMA_TOKEN.finditer(text):
        quoted, json_string, word, colon, other = match.groups()
        if quoted is not None:
            out.append(json.dumps(quoted, ensure_ascii=False))
        elif json_string is not None:
            out.append(json_string)
        elif word is not None:
            out.append(f"{json.dumps(word)}{colon}" if colon else _GEMMA_WORDS.get(word, word))
        else:
            out.append(other)
    return "".join(out)
