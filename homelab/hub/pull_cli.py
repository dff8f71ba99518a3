"""``homelab pull REPO[:QUANT]``: download a GGUF into the Hugging Face cache, verified."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="REPO[:QUANT]",
        help="e.g. unsloth/Qwen3-8B-GGUF:Q4_K_M (a quant label or a file name)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from homelab.hub.pull_command import run_pull

    return run_pull(args.model, quiet=args.quiet or args.json, as_json=args.json)
