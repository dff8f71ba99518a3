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

    path = flags.model_ref(args.model).local_path()
    summary = summarize(read_model(path), with_tensors=args.tensors)
    print(json.dumps(summary, ensure_ascii=False) if args.json else format_summary(summary))
    return 0
