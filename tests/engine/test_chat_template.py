"""ChatTemplate (sandboxed, bounded Jinja)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest

from homelab.engine.chat_template import ChatTemplate
from homelab.errors import EngineError
from homelab.gguf.vocab import CHAT_TEMPLATE

# A small Llama-3.x-style template written for these tests: BOS, header tokens, today's
# date, tools as indented JSON in the system turn, and role alternation enforced.
LLAMA3_STYLE_TEMPLATE = """{{- bos_token }}
{%- set date_string = strftime_now("%d %b %Y") %}
<|start_header_id|>system<|end_header_id|>

Today Date: {{ date_string }}
{% if tools %}
You can call these functions:
{% for tool in tools %}
{{ tool | tojson(indent=2) }}
{% endfor %}
{% endif %}
<|eot_id|>
{%- for message in messages %}
{%- if (message.role == 'user') != (loop.index0 % 2 == 0) %}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}
{%- endif %}
<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content | trim }}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

USER_HELLO = [{"role": "user", "content": "Hello, wörld 日本"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo d'une ville",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


# --- rendering ---------------------------------------------------------------------------


def test_demo_template_renders_the_chatml_conversation() -> None:
    template = ChatTemplate(CHAT_TEMPLATE)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "¿Qué tal?"},
    ]
    assert template.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n¿Qué tal?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_generation_prompt_can_be_left_out() -> None:
    rendered = ChatTemplate(CHAT_TEMPLATE).render(USER_HELLO, add_generation_prompt=False)
    assert rendered == "<|im_start|>user\nHello, wörld 日本<|im_end|>\n"


def test_tools_are_rendered_as_json_that_keeps_non_ascii() -> None:
    rendered = ChatTemplate(CHAT_TEMPLATE).render(USER_HELLO, tools=[WEATHER_TOOL])
    assert "<tools>" in rendered
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in rendered
    assert "Météo" in rendered and "\\u00e9" not in rendered


def test_assistant_tool_calls_and_tool_results_render() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            ],
        },
        {"role": "tool", "content": '{"temp_c": 21}'},
    ]
    rendered = ChatTemplate(CHAT_TEMPLATE).render(messages, tools=[WEATHER_TOOL])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' in rendered
    assert '<tool_response>\n{"temp_c": 21}\n</tool_response>' in rendered


def test_supports_tools_follows_the_template_source() -> None:
    assert ChatTemplate(CHAT_TEMPLATE).supports_tools
    assert ChatTemplate(LLAMA3_STYLE_TEMPLATE).supports_tools
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert not ChatTemplate(plain).supports_tools


def test_llama3_style_template_uses_bos_date_and_trims_blocks() -> None:
    template = ChatTemplate(LLAMA3_STYLE_TEMPLATE, bos_token="<|begin_of_text|>")
    rendered = template.render(USER_HELLO)
    today = datetime.now().strftime("%d %b %Y")
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        f"Today Date: {today}\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello, wörld 日本<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_tojson_indent_argument() -> None:
    rendered = ChatTemplate(LLAMA3_STYLE_TEMPLATE).render(USER_HELLO, tools=[WEATHER_TOOL])
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False, indent=2) in rendered


def test_raise_exception_becomes_a_clear_engine_error() -> None:
    template = ChatTemplate(LLAMA3_STYLE_TEMPLATE)
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(EngineError, match="chat template failed: Conversation roles must alt"):
        template.render(two_users)


def test_extra_variables_reach_the_template() -> None:
    template = ChatTemplate("{{ enable_thinking }}|{{ eos_token }}", eos_token="</s>")
    assert template.render([], enable_thinking=False) == "False|</s>"


def test_loop_controls_and_generation_tag_are_available() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    assert ChatTemplate(source).render([{"content": "one"}, {"content": "two"}]) == "one"


def test_syntax_error_is_reported_at_construction_with_the_line() -> None:
    with pytest.raises(EngineError, match=r"chat template failed: it does not compile \(line 2"):
        ChatTemplate("ok\n{% for %}")


def test_concurrent_renders_are_independent() -> None:
    template = ChatTemplate(CHAT_TEMPLATE)
    conversations = [[{"role": "user", "content": f"question {index}"}] for index in range(16)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(template.render, conversations))
    for index, rendered in enumerate(results):
        assert f"question {index}<|im_end|>" in rendered


def test_long_conversations_are_not_cut_by_the_output_budget() -> None:
    long_text = "x" * 3_000_000  # longer than the 1 MiB budget for the template's own text
    rendered = ChatTemplate(CHAT_TEMPLATE).render([{"role": "user", "content": long_text}])
    assert long_text in rendered


# --- hostile templates -------------------------------------------------------------------

ESCAPE_ATTEMPTS = {
    "class-of-list": "{{ messages.__class__ }}",
    "subclasses": "{{ ().__class__.__base__.__subclasses__() }}",
    "globals-via-cycler": "{{ cycler.__init__.__globals__.os }}",
    "template-self": "{{ self._TemplateReference__context }}",
    "format-attribute": "{{ '{0.__class__.__mro__}'.format(messages) }}",
    "mutate-messages": "{{ messages.append({'role': 'system'}) }}",
    "mutate-dict": "{{ messages[0].update({'role': 'system'}) }}",
    "func-globals": "{{ raise_exception.__globals__ }}",
}

RESOURCE_ATTACKS = {
    "nested-loops": (
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    ),
    "string-repeat": "{{ 'a' * 1000000000 }}",
    "list-repeat": "{{ ['a'] * 1000000000 }}",
    "power-tower": "{{ 10 ** (10 ** 10) }}",
    "doubling-concat": (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
    ),
    "doubling-plus": (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
        "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}"
    ),
    "shared-list-literals": (
        "{% set a = ['xxxxxxxxxx'] * 10 %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}"
        "{% set c = [b, b, b, b, b, b, b, b, b, b] %}{% set d = [c, c, c, c, c, c, c, c, c, c] %}"
        "{% set e = [d, d, d, d, d, d, d, d, d, d] %}{{ [e, e, e, e, e, e, e, e, e, e] }}"
    ),
    "wide-center": "{{ 'a' | center(999999999) }}",
    "wide-format-spec": "{{ '{:>999999999}'.format(1) }}",
    "wide-percent-format": "{{ '%999999999d' % 1 }}",
    "replace-blowup": "{{ ('a' * 100000) | replace('a', 'b' * 100000) }}",
    "join-blowup": "{{ (['a' * 100000] * 100000) | join }}",
    "str-join-blowup": "{{ ('b' * 100000).join(['a'] * 100000) }}",
    "indent-blowup": "{{ ('\\n' * 100000) | indent('x' * 100000) }}",
    "endless-recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "output-flood": "{% for i in range(100) %}{{ 'y' * 900000 }}{% endfor %}",
    "lipsum": "{{ lipsum(1000000) }}",
}


@pytest.mark.parametrize("source", ESCAPE_ATTEMPTS.values(), ids=ESCAPE_ATTEMPTS.keys())
def test_sandbox_escape_attempts_fail_loudly(source: str) -> None:
    template = ChatTemplate(source)
    with pytest.raises(EngineError, match="the model's chat template failed"):
        template.render([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("source", RESOURCE_ATTACKS.values(), ids=RESOURCE_ATTACKS.keys())
def test_resource_attacks_are_stopped_quickly(source: str) -> None:
    template = ChatTemplate(source, render_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(EngineError, match="the model's chat template failed"):
        template.render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - started < 3.0


def test_budget_errors_say_what_was_too_big() -> None:
    with pytest.raises(EngineError, match=r"rendered prompt would exceed \d+ characters"):
        ChatTemplate("{% for i in range(100) %}{{ 'y' * 900000 }}{% endfor %}").render([])
    with pytest.raises(EngineError, match="took too long"):
        ChatTemplate(RESOURCE_ATTACKS["nested-loops"], render_timeout_s=0.2).render([])


def test_small_output_budget_is_honoured() -> None:
    # The budget is max_output_chars on top of (twice) the size of the inputs.
    source = (
        "{% for m in messages %}{{ m.content }}{% endfor %}"
        "{% for i in range(n) %}{% for j in range(n) %}+{% endfor %}{% endfor %}"
    )
    template = ChatTemplate(source, max_output_chars=100)
    assert template.render([{"content": "short"}], n=5) == "short" + "+" * 25
    with pytest.raises(EngineError, match="rendered prompt would exceed"):
        template.render([{"content": "short"}], n=40)
