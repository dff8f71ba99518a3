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
    """Qwen3-Coder and its kin: <function=NAME><parameter=K>V</parameter></function>."""
    return TaggedArgs(
        name=name,
        call_open="<function=",
        name_ends=(">",),
        key_open=_PARAM,
        key_ends=(">",),
        value_open="",
        value_close="</parameter>",
        call_close="</function>",
        section=(f"<{section}>", f"</{section}>"),
        trim_newline=True,
    )


def _glm(name: str) -> TaggedArgs:
    """GLM 4.5+: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>."""
    return TaggedArgs(
        name=name,
        call_open="<tool_call>",
        name_ends=("\n", "<arg_key>", "</tool_call>"),
        key_open="<arg_key>",
        key_ends=("</arg_key>",),
        value_open="<arg_value>",
        value_close="</arg_value>",
        call_close="</tool_call>",
    )


def _hunyuan(name: str, suffix: str) -> TaggedArgs:
    """Hunyuan: GLM's tags with a suffix, <tool_calls:x><tool_call:x>NAME<tool_sep:x>
    <arg_key:x>K</arg_key:x><arg_value:x>V</arg_value:x></tool_call:x>."""
    return TaggedArgs(
        name=name,
        call_open=f"<tool_call{suffix}>",
        name_ends=(f"<tool_sep{suffix}>",),
        key_open=f"<arg_key{suffix}>",
        key_ends=(f"</arg_key{suffix}>",),
        value_open=f"<arg_value{suffix}>",
        value_close=f"</arg_value{suffix}>",
        call_close=f"</tool_call{suffix}>",
        section=(f"<tool_calls{suffix}>", f"</tool_calls{suffix}>"),
    )


def _invoke(name: str, prefix: str, section: str) -> TaggedArgs:
    """MiniMax-M2 and DeepSeek DSML: <invoke name="N"><parameter name="K">V</parameter>."""
    dsml = prefix == "<｜DSML｜"
    ends = ('" string="true">', '" string="false">') if dsml else ('">',)
    return TaggedArgs(
        name=name,
        call_open=f'{prefix}invoke name="',
        name_ends=('">',),
        key_open=f'{prefix}parameter name="',
        key_ends=ends,
        value_open="",
        value_close="</｜DSML｜parameter>" if dsml else "</parameter>",
        call_close="</｜DSML｜invoke>" if dsml else "</invoke>",
        section=(f"{prefix}{section}>", f"</{prefix.removeprefix('<')}{section}>"),
        string_ends=ends[:1] if dsml else (),
        json_ends=ends[1:] if dsml else (),
    )


_LLAMA3_ARGS = ("parameters", "arguments")
HERMES = JsonObjects(name="hermes", opener="<tool_call>", close="</tool_call>")
LLAMA3 = Composite(
    parts=(
        JsonObjects(name="llama3", opener="{", close=None, args_keys=_LLAMA3_ARGS, whole=True),
        JsonObjects(name="llama3", opener="<|python_tag|>", close=None, args_keys=_LLAMA3_ARGS),
    ),
    name="llama3",
)
GENERIC = Composite(parts=(HERMES, *LLAMA3.parts), name="generic")
GPT_OSS = Composite(parts=(*LLAMA3.parts, HERMES), name="gpt-oss")  # forced calls: bare JSON


@dataclass(frozen=True)
class Family:
    """One row of the registry: the format a model family writes, and the text in its chat
    template that identifies it (all of ``markers`` present)."""

    format: ToolFormat
    markers: tuple[str, ...]

    def matches(self, template_source: str) -> bool:
        return all(marker in template_source for marker in self.markers)


# The first match wins, so a marker that another family's marker contains comes after it.
FAMILIES: tuple[Family, ...] = (
    Family(
        format=_invoke("deepseek-v3.2", "<｜DSML｜", "function_calls"),
        markers=("｜DSML｜", "function_calls"),
    ),
    Family(format=_invoke("deepseek-v4", "<｜DSML｜", "tool_calls"), markers=("｜DSML｜",)),
    Family(
        format=_invoke("minimax-m2", "<", "minimax:tool_call"), markers=("<minimax:tool_call>",)
    ),
    Family(format=_qwen3_coder("seed-oss", "seed:tool_call"), markers=("<seed:tool_call>",)),
    Family(format=_qwen3_coder("qwen3-coder", "tool_call"), markers=(_PARAM,)),
    Family(format=_hunyuan("hunyuan", ":opensource"), markers=("':opensource'", "<tool_call{}>")),
    Family(format=_glm("glm"), markers=("<arg_key>",)),
    Family(
        format=TaggedArgs(
            name="minicpm",
            call_open='<function name="',
            name_ends=('">',),
            key_open='<param name="',
            key_ends=('">',),
            value_open="",
            value_close="</param>",
            call_close="</function>",
            cdata=True,
        ),
        markers=('<param name="',),
    ),
    Family(
        format=NamedJson(
            name="kimi-k2",
            call_open="<|tool_call_begin|>",
            name_end="<|tool_call_argument_begin|>",
            close="<|tool_call_end|>",
            section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
            clean=kimi_name,
        ),
        markers=("<|tool_calls_section_begin|>",),
    ),
    Family(
        format=NamedJson(
            name="solar",
            call_open="<|tool_call:begin|>",
            name_end="<|tool_call:args|>",
            close="<|tool_call:end|>",
            section=("<|tool_calls|>", None),
            skip_to="<|tool_call:name|>",
        ),
        markers=("<|tool_call:begin|>",),
    ),
    Family(format=Mistral(), markers=("[TOOL_CALLS]",)),
    Family(
        format=NamedJson(
            name="functionary-v3.1", call_open="<function=", name_end=">", close="</function>"
        ),
        markers=("<function=",),
    ),
    Family(
        format=JsonObjects(
            name="command-r",
            opener="<|START_ACTION|>",
            close="<|END_ACTION|>",
            name_keys=("tool_name",),
            args_keys=("parameters",),
            array=True,
            id_key="tool_call_id",
        ),
        markers=("<|START_ACTION|>",),
    ),
    Family(
        format=JsonObjects(
            name="apertus",
            opener="<|tools_prefix|>",
            close="<|tools_suffix|>",
            name_is_key=True,
            array=True,
        ),
        markers=("<|tools_prefix|>",),
    ),
    Family(
        format=JsonObjects(
            name="nemotron-v2", opener="<TOOLCALL>", close="</TOOLCALL>", array=True
        ),
        markers=("<TOOLCALL>",),
    ),
    Family(
        format=JsonObjects(name="apriel", opener="<tool_calls>", close="</tool_calls>", array=True),
        markers=("<tool_calls>",),
    ),
    Family(
        format=JsonObjects(name="gigachat", opener="<|function_call|>", close=None),
        markers=("<|function_call|>",),
    ),
    Family(
        format=JsonObjects(name="granite", opener="<|tool_call|>", close=None, array=True),
        markers=("<|tool_call|>",),
    ),
    Family(
        format=PythonCalls(name="lfm2", opener="<|tool_call_start|>", close="<|tool_call_end|>"),
        markers=("<|tool_call_start|>",),
    ),
    Family(format=GemmaCalls(), markers=("<|tool_call>",)),
    Family(format=HERMES, markers=("<tool_call>",)),
    # the harmony splitter hands calls on as <tool_call> blocks
    Family(format=GPT_OSS, markers=("<|channel|>",)),
    Family(format=LLAMA3, markers=("<|python_tag|>",)),
    Family(format=LLAMA3, markers=('{"name": function name, "parameters"',)),
)
FORMATS: dict[str, ToolFormat] = {f.format.name: f.format for f in FAMILIES} | {"generic": GENERIC}


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
    for family in FAMILIES:
        if family.matches(source):
            return Detected(family.format, True)
    if "tools" in source:
        log.warning(
            "the chat template's tool-call syntax is not one homelab knows: the generic "
            "parsers (Hermes <tool_call> JSON, bare Llama 3 JSON) are used"
        )
    return Detected(GENERIC, False)
