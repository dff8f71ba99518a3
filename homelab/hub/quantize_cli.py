"""``homelab quantize MODEL --to Q4_K_M``: quantize locally with llama.cpp's quantizer."""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", help="a GGUF path, a downloaded REPO:QUANT, or a name from `homelab models`"
    )
    parser.add_argument(
        "--to",
        dest="quant",
        default="Q4_K_M",
        help="target type: Q4_K_M (default), Q5_K_M, Q6_K, IQ4_XS, Q8_0, …",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="output file (default: next to the source, or the library folder)",
    )
    parser.add_argument("--threads", type=int, default=None, help="quantizer threads")


def run(args: argparse.Namespace) -> int:
    from homelab.hub.quantize_command import run_quantize

    return run_quantize(
        args.model, args.quant, output=args.output, n_threads=args.threads, as_json=args.json
    )
