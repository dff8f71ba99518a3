"""``tool_choice`` "required" or a named function as a grammar: the model cannot answer
without calling, and it calls in its own syntax (the one its format parses).

A format says how one call is written around the tool's name and arguments:

- JSON formats (:class:`~.json_forms.JsonObjects`, :class:`~.json_forms.NamedJson`,
  :class:`~.json_forms.Mistral`) have a *frame*: text before the arguments (the name in it)
  and after them; the arguments follow the tool's parameters schema;
- tagged formats (:class:`~.xml_forms.TaggedArgs`) write each parameter between its tags: a
  string as raw text without ``<``, any other type as JSON of its schema;
- Python-style calls (:class:`~.python_forms.PythonCalls`) write ``NAME(key=JSON, ...)``;
  Gemma 4 (:class:`~.python_forms.GemmaCalls`) writes its call with JSON arguments.

Each tool's schema becomes its own rules (prefixed ``t0-``, ``t1-``…) so tools never share
a rule that means different things.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from homelab.engine.grammar import (
    MAX_GRAMMAR_CHARS,
    MAX_SCHEMA_CHARS,
    check_grammar,
    schema_to_grammar,
)
from homelab.errors import EngineError
from homelab.server.tools.detect import GENERIC, HERMES
from homelab.server.tools.formats import Composite, ToolFormat
from homelab.server.tools.json_forms import JsonObjects, Mistral, NamedJson
from homelab.server.tools.python_forms import GemmaCalls, PythonCalls
from homelab.server.tools.xml_forms import TaggedArgs

_RULE = re.compile(r"^([A-Za-z0-9-]+) ::= (.*)$")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z][A-Za-z0-9-]*|.', re.S)
_OBJECT = {"type": "object"}


def forced_call_grammar(
    tools: Sequence[Mapping[str, Any]], only: str | None, tool_format: ToolFormat
) -> str:
    """A GBNF grammar that makes the model call one of ``tools`` (or the one named ``only``)
    in ``tool_format``'s syntax.

    Raises EngineError (from the schema converter) when a parameters schema is unusable.
    """
    chosen = [t["function"] for t in tools if only is None or t["function"]["name"] == only]
    _check_total_schema([function.get("parameters") for function in chosen])
    rules: list[str] = []
    calls: list[str] = []
    size_chars = 0
    for number, function in enumerate(chosen):
        call, extra = _call_rule(tool_format, function, f"t{number}-")
        calls.append(call)
        rules += extra
        size_chars += len(call) + sum(len(rule) for rule in extra)
        if size_chars > MAX_GRAMMAR_CHARS:  # stop building now: check_grammar would refuse it
            raise EngineError(
                f"the forced tool call's grammar is over {MAX_GRAMMAR_CHARS} characters",
                hint="Offer fewer or smaller tools, or do not force the call.",
            )
    grammar = "\n".join([f"root ::= {' | '.join(f'( {c} )' for c in calls)}", *rules]) + "\n"
    check_grammar(grammar)
    return grammar


def _check_total_schema(schemas: list[Any]) -> None:
    """Every chosen tool's parameters together within one schema's bound: the converter's
    work grows with their total size, whatever the number of tools or properties."""
    size_chars = len(json.dumps(schemas))
    if size_chars > MAX_SCHEMA_CHARS:
        raise EngineError(
            f"the tools' parameter schemas are {size_chars} characters together; a forced "
            f"tool call takes at most {MAX_SCHEMA_CHARS}",
            hint="Offer fewer or smaller tools, or do not force the call.",
        )


def _call_rule(
    tool_format: ToolFormat, function: Mapping[str, Any], prefix: str
) -> tuple[str, list[str]]:
    name = str(function["name"])
    schema = function.get("parameters") or _OBJECT
    if isinstance(tool_format, Composite):
        tool_format = HERMES if tool_format is GENERIC else tool_format.parts[0]
    if isinstance(tool_format, TaggedArgs):
        return _tagged(tool_format, name, schema, prefix)
    if isinstance(tool_format, PythonCalls):
        return _python(tool_format, name, schema, prefix)
    if isinstance(tool_format, GemmaCalls):  # JSON arguments: the parser reads them too
        before, after = f"{tool_format.opener}call:{name}", tool_format.close
    else:
        before, after = _frame(tool_format, name)
    root, rules = _schema_rules(schema, prefix)
    return f"{_lit(before)} {root} {_lit(after)}", rules


def _frame(tool_format: ToolFormat, name: str) -> tuple[str, str]:
    """The text around a JSON-arguments call."""
    quoted = json.dumps(name, ensure_ascii=False)
    if isinstance(tool_format, Mistral):
        return f"[TOOL_CALLS]{name}[ARGS]", ""
    if isinstance(tool_format, NamedJson):
        return _named_frame(tool_format, name)
    assert isinstance(tool_format, JsonObjects)
    if tool_format.name_is_key:
        head = f"{{{quoted}: "
    else:
        number = f'"{tool_format.id_key}": "0", ' if tool_format.id_key else ""
        name_key, args_key = tool_format.name_keys[0], tool_format.args_keys[0]
        head = f'{{{number}"{name_key}": {quoted}, "{args_key}": '
    head, tail = ("[" + head, "}]") if tool_format.array else (head, "}")
    opener = "" if tool_format.opener == "{" else tool_format.opener
    newline = "\n" if tool_format.close == "</tool_call>" else ""
    return f"{opener}{newline}{head}", f"{tail}{newline}{tool_format.close or ''}"


def _named_frame(tool_format: NamedJson, name: str) -> tuple[str, str]:
    shown = f"functions.{name}:0" if tool_format.name == "kimi-k2" else name
    head = tool_format.call_open
    if tool_format.skip_to:
        head += "call_0" + tool_format.skip_to
    before = f"{head}{shown}{tool_format.name_end}"
    after = tool_format.close or ""
    if tool_format.section:
        before = tool_format.section[0] + before
        after += tool_format.section[1] or ""
    return before, after


def _tagged(
    tool_format: TaggedArgs, name: str, schema: Mapping[str, Any], prefix: str
) -> tuple[str, list[str]]:
    """Each parameter once, in the schema's order; the required ones must be there."""
    rules: list[str] = []
    params: list[str] = []
    required = set(schema.get("required") or ())
    newline = '"\\n"' if tool_format.trim_newline else ""
    for number, (key, sub) in enumerate((schema.get("properties") or {}).items()):
        value, sub_rules = _value_rule(sub, f"{prefix}p{number}-")
        rules += sub_rules
        open_key = tool_format.key_open + key + _key_end(tool_format, sub) + tool_format.value_open
        param = f"{_lit(open_key)} {newline} {value} {newline} {_lit(tool_format.value_close)}"
        params.append(f'( {param} "\\n"? )' + ("" if key in required else "?"))
    head = tool_format.call_open + name + tool_format.name_ends[0]
    call = f'{_lit(head)} "\\n"? {" ".join(params)} {_lit(tool_format.call_close)}'
    if tool_format.section:
        opener, closer = _lit(tool_format.section[0]), _lit(tool_format.section[1] or "")
        call = f'{opener} "\\n"? {call} "\\n"? {closer}'
    return call, rules


def _key_end(tool_format: TaggedArgs, schema: object) -> str:
    if tool_format.string_ends and _is_string(schema):
        return tool_format.string_ends[0]
    if tool_format.json_ends and not _is_string(schema):
        return tool_format.json_ends[0]
    return tool_format.key_ends[0]


def _value_rule(schema: object, prefix: str) -> tuple[str, list[str]]:
    """A raw-text parameter value: an enum's words, text without ``<`` for a string, else
    JSON of the schema."""
    choices = schema.get("enum") if isinstance(schema, Mapping) else None
    if _is_string(schema) and isinstance(choices, list) and choices:
        return "( " + " | ".join(_lit(str(c)) for c in choices) + " )", []
    if _is_string(schema):
        return "[^<]*", []
    return _schema_rules(schema if isinstance(schema, Mapping) else {}, prefix)


def _is_string(schema: object) -> bool:
    return isinstance(schema, Mapping) and schema.get("type") == "string"


def _python(
    tool_format: PythonCalls, name: str, schema: Mapping[str, Any], prefix: str
) -> tuple[str, list[str]]:
    """Every parameter, in the schema's order (a keyword list has no optional commas)."""
    rules: list[str] = []
    params: list[str] = []
    for number, (key, sub) in enumerate((schema.get("properties") or {}).items()):
        value, sub_rules = _schema_rules(
            sub if isinstance(sub, Mapping) else {}, f"{prefix}p{number}-"
        )
        rules += sub_rules
        params.append(f"{_lit(key + '=')} {value}")
    args = ' ", " '.join(params)
    call = f"{_lit(tool_format.opener + '[' + name + '(')} {args} {_lit(')]' + tool_format.close)}"
    return call, rules


def _schema_rules(schema: Mapping[str, Any], prefix: str) -> tuple[str, list[str]]:
    """The schema's grammar with every rule renamed ``prefix + name``; (root rule, rules)."""
    grammar = schema_to_grammar(dict(schema))
    parsed = [m.groups() for line in grammar.splitlines() if (m := _RULE.match(line))]
    names = {name for name, _ in parsed}
    rules = [f"{prefix}{name} ::= {_renamed(body, names, prefix)}" for name, body in parsed]
    return f"{prefix}root", rules


def _renamed(body: str, names: set[str], prefix: str) -> str:
    tokens = _TOKEN.findall(body)
    return "".join(prefix + t if t in names else t for t in tokens)


def _lit(text: str) -> str:
    """A GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"' if text else ""
