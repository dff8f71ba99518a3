"""The tools a request offered, as the parsers need them: which names may be called, and
the JSON type of each parameter (formats that write arguments as raw text are typed by it)."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from homelab.server.tools.strict_json import check_json_value, strict_json_loads

_JSON_TYPES = {"integer", "number", "boolean", "object", "array", "null"}


@dataclass(frozen=True)
class ToolSet:
    """Offered function tools; ``names`` None means any name is accepted (no tools given)."""

    names: frozenset[str] | None = None
    types: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: Sequence[Mapping[str, Any]] | None) -> ToolSet:
        """From OpenAI-shaped tools (``{"type": "function", "function": {...}}``)."""
        if tools is None:
            return cls()
        functions = [tool.get("function", tool) for tool in tools]
        return cls(
            frozenset(str(f.get("name", "")) for f in functions),
            {str(f.get("name", "")): _parameter_types(f.get("parameters")) for f in functions},
        )

    def offers(self, name: str) -> bool:
        return bool(name) and (self.names is None or name in self.names)

    def type_of(self, tool: str, parameter: str) -> str | None:
        """The parameter's JSON type from the schema ("string", "integer"...), or None."""
        return self.types.get(tool, {}).get(parameter)

    def value(self, tool: str, parameter: str, raw: str) -> Any:
        """A raw-text argument as the JSON value the schema asks for.

        A string parameter keeps the text as written; a typed one is read as JSON (Python's
        ``True``/``False``/``None`` too, which some templates render); anything unreadable stays
        text, since the model did write it.
        """
        kind = self.type_of(tool, parameter)
        if kind == "string":
            return raw
        if kind is not None and kind not in _JSON_TYPES:
            return raw
        return json_or_text(raw)


def json_or_text(raw: str) -> Any:
    """``raw`` as the JSON value it spells (strict JSON, or a Python literal of JSON's
    types); anything else (a set, bytes, ``...``, ``NaN``, ``1e999``) stays the text."""
    text = raw.strip()
    python = {"True": True, "False": False, "None": None}
    if text in python:
        return python[text]
    try:
        return strict_json_loads(text)
    except (ValueError, RecursionError):
        pass
    try:  # templates that render arguments with ``| string`` write Python literals
        value = ast.literal_eval(text) if len(text) < 100_000 else raw
        check_json_value(value)
    except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
        return raw  # Malformed is a ValueError
    return value


def _parameter_types(schema: object) -> dict[str, str]:
    if not isinstance(schema, Mapping):
        return {}
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return {}
    return {str(k): _type_name(v) for k, v in properties.items() if _type_name(v)}


def _type_name(schema: object) -> str:
    if not isinstance(schema, Mapping):
        return ""
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first non-null one
        kind = next((k for k in kind if k != "null"), "null")
    return kind if isinstance(kind, str) else ""
