"""``homelab template (MODEL | --template FILE.jinja)``: what the server makes of a model's
chat template — the tool-call format and reasoning style it detects, the special tokens, the
exact prompt a request becomes (``--render REQUEST.json``) and the parse of an output
(``--parse OUTPUT.txt``). For the person whose agent misbehaves."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from homelab.cli import flags
from homelab.errors import HomelabError


class TemplateError(HomelabError):
    title = "Chat template problem"


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(parser, optional=True, help="a model whose GGUF holds the chat template")
    parser.add_argument("--template", type=Path, help="a chat template file (.jinja) instead")
    parser.add_argument("--render", type=Path, help="a Chat Completions request body (JSON)")
    parser.add_argument("--parse", type=Path, help="a model's output to parse (text)")


def run(args: argparse.Namespace) -> int:
    from homelab.server.template_report import parsed_output, rendered_prompt, template_facts

    template, special = _load(args)
    body = _read_json(args.render) if args.render else None
    report: dict[str, Any] = {"template": template_facts(template, special).as_json()}
    if body is not None:
        report["prompt"] = rendered_prompt(template, body)
    if args.parse:
        report["parse"] = parsed_output(template, args.parse.read_text(), body)
    print(_json(report) if args.json else _text(report))
    return 0


def _json(report: dict[str, Any]) -> str:
    """With ``--parse``, the parse's keys (format, content, reasoning, tool_calls) lead."""
    parse = report.pop("parse", {})
    return json.dumps({**parse, **report}, ensure_ascii=False, indent=2)


def _load(args: argparse.Namespace) -> tuple[Any, dict[str, str]]:
    """The template (from the file, or the model's GGUF) and the special tokens to show."""
    from homelab.engine.chat_template import ChatTemplate

    if (args.template is None) == (args.model is None):
        raise TemplateError("give a MODEL or --template FILE.jinja (one of them)")
    if args.template is not None:
        return ChatTemplate(args.template.read_text()), {}
    path = flags.model_ref(args.model).local_path()
    source, special = _model_template(path)
    if source is None:
        raise TemplateError(f"{path} has no chat template")
    return ChatTemplate(source, special.get("bos", ""), special.get("eos", "")), special


def _model_template(path: Path) -> tuple[str | None, dict[str, str]]:
    from homelab.gguf.reader import read_model
    from homelab.llamacpp.model import Model, ModelParams

    info = read_model(path)
    with Model.load(path, ModelParams(n_gpu_layers=0, vocab_only=True)) as model:
        vocab = model.vocab
        special = {
            "bos": vocab.token_bytes(vocab.bos, special=True).decode(errors="replace"),
            "eos": vocab.token_bytes(vocab.eos, special=True).decode(errors="replace"),
        }
    return info.chat_template, special


def _read_json(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except ValueError as exc:
        raise TemplateError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise TemplateError(f"{path} is not a JSON object (a chat request body)")
    return body


def _text(report: dict[str, Any]) -> str:
    facts = report["template"]
    known = "" if facts["tool_format_known"] else " — the generic parsers are used"
    lines = [
        f"tool-call format  {facts['tool_format']}{known}",
        f"reasoning         {facts['reasoning']}",
        f"supports tools    {'yes' if facts['supports_tools'] else 'no'}",
        f"markers           {' '.join(facts['markers']) or '-'}",
    ]
    lines += [f"{name + ' token':<18}{text!r}" for name, text in facts["special_tokens"].items()]
    if "prompt" in report:
        lines += ["", "--- prompt ---", report["prompt"]]
    if "parse" in report:
        lines += ["", "--- parse ---", json.dumps(report["parse"], ensure_ascii=False, indent=2)]
    return "\n".join(lines)
