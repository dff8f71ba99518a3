"""``homelab inspect MODEL``: what a GGUF file (or split set) says about its model."""

from __future__ import annotations

import argparse
import json

from homelab.cli import flags


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(
        parser, help="a .gguf file (any part of a split set), or any MODEL with a local file"
    )
    parser.add_argument("--tensors", action="store_true", help="also list every tensor")


def run(args: argparse.Namespace) -> int:
    from homelab.gguf.reader import read_model
    from homelab.gguf.summary import format_summary, summarize
    from homelab.server.tools import detect_tool_format

    path = flags.model_ref(args.model).local_path()
    info = read_model(path)
    summary = summarize(info, with_tensors=args.tensors)
    summary["tool_call_format"] = (
        detect_tool_format(info.chat_template).name if info.chat_template else None
    )
    text = format_summary(summary).replace(
        "\nchat template   yes",
        f"\nchat template   yes (tool calls: {summary['tool_call_format']})",
    )
    print(json.dumps(summary, ensure_ascii=False) if args.json else text)
    return 0
