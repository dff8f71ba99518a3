"""``homelab quantize MODEL --to Q4_K_M``: quantize a local model with llama.cpp's quantizer;
the new file records where it came from (see :mod:`homelab.hub.local_quantize`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from homelab.cli import flags


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(parser)
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
    from homelab.hub.local_quantize import quantize_model
    from homelab.hub.render import format_quantized

    source = flags.model_ref(args.model).local_path()
    bar = _TensorBar(args.quant.upper())
    try:
        record = quantize_model(
            str(source),
            args.quant,
            output=args.output,
            n_threads=args.threads,
            progress=None if args.json else bar,
        )
    finally:
        bar.close()
    print(json.dumps(asdict(record), indent=2) if args.json else format_quantized(record))
    return 0


class _TensorBar:
    """A tqdm bar over tensors (llama.cpp reports them one by one)."""

    def __init__(self, quant: str) -> None:
        self.quant = quant
        self._bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(
                total=total,
                desc=f"quantizing to {self.quant}",
                unit="tensor",
                file=sys.stderr,
                leave=False,
            )
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
