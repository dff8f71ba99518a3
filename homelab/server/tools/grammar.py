"""``tool_choice`` "required" or a named function as a grammar: the model cannot answer
without calling (in the ``<tool_call>`` form when its template uses it, else bare JSON)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from homelab.engine.grammar import schema_to_grammar
from homelab.server.tools.stream import CLOSE_TAG, OPEN_TAG

_CALL_RULE = "homelab-tool-call"


def uses_tagged_calls(template_source: str) -> bool:
    return OPEN_TAG in template_source


def forced_call_grammar(tools: Sequence[dict[str, Any]], only: str | None, tagged: bool) -> str:
    """A GBNF grammar that makes the model call one of ``tools`` (or the one named ``only``).

    Raises EngineError (from the schema converter) when the parameters schema is unusable.
    """
    arguments_key = "arguments" if tagged else "parameters"
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                arguments_key: tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", arguments_key],
        }
        for tool in tools
        if only is None or tool["function"]["name"] == only
    ]
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    call_grammar = re.sub(
        r"^root\s*::=", f"{_CALL_RULE} ::=", schema_to_grammar(schema), flags=re.M
    )
    if tagged:
        root = f'root ::= "{OPEN_TAG}" "\\n"? {_CALL_RULE} "\\n"? "{CLOSE_TAG}"'
    else:
        root = f"root ::= {_CALL_RULE}"
    return root + "\n" + call_grammar
