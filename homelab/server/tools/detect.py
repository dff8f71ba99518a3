"""Which tool-call format a model writes, read once from its chat template's text.

Each family is recognised by a marker only its template contains (the way the template
renders an assistant turn's ``tool_calls`` is the way the model was trained to write them).
A template with tools but no known marker gets the generic parser (Hermes ``<tool_call>``
JSON blocks and bare Llama 3 JSON) and :attr:`Detected.known` says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache

from homelab.server.tools.formats import Composite, ToolFormat
from homelab.server.tools.json_forms import JsonObjects, Mistral, NamedJson, kimi_name
from homelab.server.tools.python_forms import GemmaCalls, PythonCalls
from homelab.server.tools.xml_forms import TaggedArgs

log = logging.getLogger(__name__)
_PARAM = "<parameter="


def _qwen3_coder(name: str, section: str) -> TaggedArgs:
    return TaggedArgs(
        name, "<function=", (">",), _PARAM, (">",), "", "</parameter>", "</function>",
        section=(f"<{section}>", f"</{section}>"), trim_newline=True,
    )  # fmt: skip


def _glm(name: str, suffix: str = "") -> TaggedArgs:
    key, value = f"<arg_key{suffix}>", f"<arg_value{suffix}>"
    close = f"</tool_call{suffix}>"
    if suffix:  # Hunyuan: <tool_calls:x><tool_call:x>NAME<tool_sep:x><arg_key:x>...
        return TaggedArgs(
            name, f"<tool_call{suffix}>", (f"<tool_sep{suffix}>",), key, (f"</arg_key{suffix}>",),
            value, f"</arg_value{suffix}>", close,
            section=(f"<tool_calls{suffix}>", f"</tool_calls{suffix}>"),
        )  # fmt: skip
    return TaggedArgs(
        name, "<tool_call>", ("\n", key, close), key, ("</arg_key>",), value, "</arg_value>", close
    )


def _invoke(name: str, prefix: str, section: str) -> TaggedArgs:
    """MiniMax-M2 and DeepSeek DSML: <invoke name="N"><parameter name="K">V</parameter>."""
    dsml = prefix == "<｜DSML｜"
    ends = ('" string="true">', '" string="false">') if dsml else ('">',)
    return TaggedArgs(
        name, f'{prefix}invoke name="', ('">',), f'{prefix}parameter name="', ends, "",
        "</｜DSML｜parameter>" if dsml else "</parameter>",
        "</｜DSML｜invoke>" if dsml else "</invoke>",
        section=(f"{prefix}{section}>", f"</{prefix.removeprefix('<')}{section}>"),
        string_ends=ends[:1] if dsml else (), json_ends=ends[1:] if dsml else (),
    )  # fmt: skip


_LLAMA3_ARGS = ("parameters", "arguments")
HERMES = JsonObjects("hermes", "<tool_call>", "</tool_call>")
LLAMA3 = Composite(
    (
        JsonObjects("llama3", "{", None, args_keys=_LLAMA3_ARGS, whole=True),
        JsonObjects("llama3", "<|python_tag|>", None, args_keys=_LLAMA3_ARGS),
    ),
    name="llama3",
)
GENERIC = Composite((HERMES, *LLAMA3.parts), name="generic")
GPT_OSS = Composite((*LLAMA3.parts, HERMES), name="gpt-oss")  # forced calls: bare JSON

# (format, the template text that identifies it: all of these strings); the first match wins,
# so a marker that another family's marker contains comes after it.
FAMILIES: tuple[tuple[ToolFormat, str | tuple[str, ...]], ...] = (
    (_invoke("deepseek-v3.2", "<｜DSML｜", "function_calls"), ("｜DSML｜", "function_calls")),
    (_invoke("deepseek-v4", "<｜DSML｜", "tool_calls"), "｜DSML｜"),
    (_invoke("minimax-m2", "<", "minimax:tool_call"), "<minimax:tool_call>"),
    (_qwen3_coder("seed-oss", "seed:tool_call"), "<seed:tool_call>"),
    (_qwen3_coder("qwen3-coder", "tool_call"), _PARAM),
    (_glm("hunyuan", ":opensource"), ("':opensource'", "<tool_call{}>")),
    (_glm("glm"), "<arg_key>"),
    (
        TaggedArgs(
            "minicpm",
            '<function name="',
            ('">',),
            '<param name="',
            ('">',),
            "",
            "</param>",
            "</function>",
            cdata=True,
        ),
        '<param name="',
    ),
    (
        NamedJson(
            "kimi-k2",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
            section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
            clean=kimi_name,
        ),
        "<|tool_calls_section_begin|>",
    ),
    (
        NamedJson(
            "solar",
            "<|tool_call:begin|>",
            "<|tool_call:args|>",
            "<|tool_call:end|>",
            section=("<|tool_calls|>", None),
            skip_to="<|tool_call:name|>",
        ),
        "<|tool_call:begin|>",
    ),
    (Mistral(), "[TOOL_CALLS]"),
    (NamedJson("functionary-v3.1", "<function=", ">", "</function>"), "<function="),
    (
        JsonObjects(
            "command-r",
            "<|START_ACTION|>",
            "<|END_ACTION|>",
            ("tool_name",),
            ("parameters",),
            array=True,
            id_key="tool_call_id",
        ),
        "<|START_ACTION|>",
    ),
    (
        JsonObjects(
            "apertus", "<|tools_prefix|>", "<|tools_suffix|>", name_is_key=True, array=True
        ),
        "<|tools_prefix|>",
    ),
    (JsonObjects("nemotron-v2", "<TOOLCALL>", "</TOOLCALL>", array=True), "<TOOLCALL>"),
    (JsonObjects("apriel", "<tool_calls>", "</tool_calls>", array=True), "<tool_calls>"),
    (JsonObjects("gigachat", "<|function_call|>", None), "<|function_call|>"),
    (JsonObjects("granite", "<|tool_call|>", None, array=True), "<|tool_call|>"),
    (PythonCalls("lfm2", "<|tool_call_start|>", "<|tool_call_end|>"), "<|tool_call_start|>"),
    (GemmaCalls(), "<|tool_call>"),
    (HERMES, "<tool_call>"),
    (GPT_OSS, "<|channel|>"),  # the harmony splitter hands calls on as <tool_call> blocks
    (LLAMA3, "<|python_tag|>"),
    (LLAMA3, '{"name": function name, "parameters"'),
)
FORMATS: dict[str, ToolFormat] = {f.name: f for f, _ in FAMILIES} | {"generic": GENERIC}


@dataclass(frozen=True)
class Detected:
    """The format chosen for a model, and whether its template named it (``known``)."""

    format: ToolFormat
    known: bool

    @property
    def name(self) -> str:
        return self.format.name if self.known else "generic (not recognised)"


@lru_cache(maxsize=64)
def detect_tool_format(template_source: str | None) -> Detected:
    """The format a model with this chat template writes its tool calls in (cached: the
    server asks on every request, the answer is chosen once per template)."""
    source = template_source or ""
    for tool_format, marker in FAMILIES:
        if all(m in source for m in ((marker,) if isinstance(marker, str) else marker)):
            return Detected(tool_format, True)
    if "tools" in source:
        log.warning(
            "the chat template's tool-call syntax is not one homelab knows: the generic "
            "parsers (Hermes <tool_call> JSON, bare Llama 3 JSON) are used"
        )
    return Detected(GENERIC, False)
