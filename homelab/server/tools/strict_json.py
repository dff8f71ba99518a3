"""Arguments as strict JSON: what the tool-call parsers accept as a call's argument values.

Model output is untrusted (a tool result can steer it), and every client parses a call's
arguments with a strict JSON parser: ``NaN``, ``Infinity`` and numbers beyond a double
(``1e999``) are not JSON, and what ``ast.literal_eval`` or a Python-style call can spell
(sets, bytes, ``...``, complex numbers) is no JSON value at all. Both are refused here, so
a parser hands such text back as content (or keeps it as text) instead of sending it on.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 128  # deeper arguments are refused: no real tool takes them, a hostile model may


class Malformed(ValueError):
    """The text cannot be what the format says comes here."""


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is too large for JSON")
    return value


def strict_json_loads(text: str) -> Any:
    """``json.loads`` without the non-standard constants; raises ValueError on them."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite)


def check_json_value(value: object, depth: int = 0) -> None:
    """Raise :class:`Malformed` unless ``value`` is made of JSON's types only (str-keyed
    dicts, lists, strings, finite numbers, booleans, None): what ``ast.literal_eval`` or a
    Python-style call may give (sets, bytes, ``...``, complex, ``inf``) is not an argument."""
    if depth > MAX_DEPTH:
        raise Malformed("arguments nested too deeply")
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Malformed(f"{value} is not a JSON number")
        return
    if isinstance(value, list):
        for item in value:
            check_json_value(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise Malformed("an object key is not a string")
            check_json_value(item, depth + 1)
        return
    raise Malformed(f"a {type(value).__name__} is not a JSON value")
