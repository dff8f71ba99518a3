"""JSON schema to GBNF with llama-cpp-python's converter (the one llama.cpp's server uses).

The converter raises whatever Python error the schema provokes; here every one of them
becomes an :class:`EngineError` the server can return as a 400.
"""

from __future__ import annotations

from homelab.errors import EngineError
from homelab.llamacpp._lib import lib


def json_schema_to_gbnf(schema_json: str) -> str:
    """A GBNF grammar (start rule ``root``) accepting what the JSON schema text describes."""
    lib()  # the converter lives in the package; load it the one way homelab does
    from llama_cpp.llama_grammar import json_schema_to_gbnf as convert

    try:
        return str(convert(schema_json))
    except (ValueError, KeyError, TypeError, AssertionError, RecursionError) as exc:
        raise EngineError(
            f"the JSON schema cannot be turned into a grammar: {exc}",
            hint="Use standard JSON-schema keywords (type, properties, items, enum, …).",
        ) from exc
