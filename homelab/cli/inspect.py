"""``homelab inspect MODEL``: what a GGUF file (or split set) says about its model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from homelab.cli import flags

if TYPE_CHECKING:
    from homelab.gguf.model import ModelInfo


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(
        parser, help="a .gguf file (any part of a split set), or any MODEL with a local file"
    )
    parser.add_argument("--tensors", action="store_true", help="also list every tensor")


def run(args: argparse.Namespace) -> int:
    from homelab.gguf.projector import is_projector
    from homelab.gguf.reader import read_model
    from homelab.gguf.summary import format_summary, summarize
    from homelab.server.tools import detect_tool_format

    path = flags.model_ref(args.model).local_path()
    if is_projector(path):
        return _projector(path, args.json)
    info = read_model(path)
    summary = summarize(info, with_tensors=args.tensors)
    summary["tool_call_format"] = (
        detect_tool_format(info.chat_template).name if info.chat_template else None
    )
    vision, summary["mmproj"] = _vision(info)
    text = format_summary(summary).replace(
        "\nchat template   yes",
        f"\nchat template   yes (tool calls: {summary['tool_call_format']})",
    )
    print(
        json.dumps(summary, ensure_ascii=False)
        if args.json
        else f"{text}\nvision          {vision}"
    )
    return 0


def _vision(info: ModelInfo) -> tuple[str, dict[str, object] | None]:
    """(a line on the projector found beside the model, its summary or None)."""
    from homelab.errors import ModelFileError
    from homelab.gguf.projector import describe_projector, projector_summary
    from homelab.models.mmproj import projector_for

    try:
        projector = projector_for(info)
    except ModelFileError as error:
        return f"the projector beside it does not fit: {error}", None
    if projector is None:
        return "no projector (mmproj) beside it: text only", None
    return describe_projector(projector), projector_summary(projector)


def _projector(path: Path, as_json: bool) -> int:
    """A projector file on its own: what it is and which text models it fits."""
    from homelab.gguf.projector import describe_projector, projector_summary, read_projector

    projector = read_projector(path)
    summary = projector_summary(projector)
    if as_json:
        print(json.dumps(summary))
        return 0
    width = projector.n_embd_out or "unknown"
    print(f"vision projector  {describe_projector(projector)}\nfeeds a text model of width {width}")
    return 0
