"""``homelab template`` and ``homelab inspect`` say which tool-call format a model writes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from template_corpus import templates_dir
from tool_format_cases import TOOLS

from homelab.cli import main

# A Qwen3.5 reply: its prompt opens the think block, so the output starts inside it.
OUTPUT = (
    "Oslo it is.</think>\nSure.\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
    "</tool_call>"
)


def test_template_parses_an_output_and_renders_a_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
    )
    output = tmp_path / "output.txt"
    output.write_text(OUTPUT)
    template = str(templates_dir() / "Qwen3.5-4B.jinja")
    assert main(["template", "--json", "--template", template, "--render", str(request),
                 "--parse", str(output)]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == report["template"]["tool_format"] == "qwen3-coder"
    assert (report["content"], report["reasoning"]) == ("Sure.", "Oslo it is.")
    assert report["tool_calls"] == [
        {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}
    ]
    assert report["prompt"].endswith("<|im_start|>assistant\n<think>\n")
    assert "get_weather" in report["prompt"] and report["template"]["supports_tools"]


def test_template_says_when_the_format_is_not_recognised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain.jinja"
    plain.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}")
    assert main(["template", "--template", str(plain)]) == 0
    out = capsys.readouterr().out
    assert "generic (not recognised)" in out and "the generic parsers are used" in out


def test_template_needs_exactly_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["template"]) == 1
    assert "MODEL or --template" in capsys.readouterr().err


def test_inspect_and_template_read_a_models_own_template(
    demo_model: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(demo_model("llama"))
    assert main(["inspect", "--json", path]) == 0
    assert json.loads(capsys.readouterr().out)["tool_call_format"]
    assert main(["template", "--json", path]) == 0
    facts = json.loads(capsys.readouterr().out)["template"]
    assert facts["special_tokens"]["eos"] and facts["tool_format"]
