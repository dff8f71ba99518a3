"""``homelab pull REPO[:QUANT]``: download a GGUF into the Hugging Face cache, verified and
resumable. Without a quant, the one the planner picks for this machine."""

from __future__ import annotations

import argparse
import json
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="REPO[:QUANT]",
        help="e.g. unsloth/Qwen3-8B-GGUF:Q4_K_M (a quant label or a file name)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from homelab.errors import HubError
    from homelab.hub.progress import ProgressSink, SilentProgress
    from homelab.hub.pull import pull
    from homelab.hub.quants import parse_model_ref
    from homelab.hub.render import TqdmProgress, format_pulled, pulled_document
    from homelab.hub.resolve import best_quant
    from homelab.planner.budget import resolve_hardware
    from homelab.units import format_size

    ref = parse_model_ref(args.model)
    if ref is None:
        raise HubError(
            f"{args.model!r} is not a hub repo name.",
            hint="Use org/name or org/name:QUANT, e.g. unsloth/Qwen3-8B-GGUF:Q4_K_M.",
        )
    if ref.selector is None:
        ref, entry = best_quant(ref, resolve_hardware())
        if entry is not None:
            print(
                f"homelab: no quant given; {entry.label} ({format_size(entry.total_bytes)}) fits "
                f"this machine best (see `homelab search {ref.repo_id} --plan`).",
                file=sys.stderr,
            )
    sink: ProgressSink = SilentProgress() if args.quiet or args.json else TqdmProgress()
    try:
        pulled = pull(ref, progress=sink)
    except KeyboardInterrupt:
        sink.finish()
        print(
            "homelab: download interrupted; what was fetched is kept — run the same "
            "command again to resume.",
            file=sys.stderr,
        )
        return 130
    for note in pulled.notes:
        print(f"homelab: {note}", file=sys.stderr)
    print(json.dumps(pulled_document(pulled), indent=2) if args.json else format_pulled(pulled))
    return 0
