"""``homelab pull REPO[:QUANT]`` (or a catalogue name): download a GGUF into the Hugging Face
cache, verified and resumable. Without a quant, the one the planner picks for this machine; a
catalogue name (``llama-3.1-8b``) pulls its default repo's planned quant."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from homelab.hub.quants import ModelRef as HubRef


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="REPO[:QUANT]",
        help="e.g. unsloth/Qwen3-8B-GGUF:Q4_K_M (a quant label or a file name), or a "
        "catalogue name such as qwen3-8b",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-mmproj",
        action="store_true",
        help="leave out the vision projector the repo offers (fetched beside the model)",
    )


def run(args: argparse.Namespace) -> int:
    from homelab.errors import HubError
    from homelab.hub.progress import ProgressSink, SilentProgress
    from homelab.hub.pull import pull
    from homelab.hub.quants import parse_model_ref
    from homelab.hub.render import TqdmProgress, format_pulled, pulled_document
    from homelab.hub.resolve import best_quant
    from homelab.planner.budget import resolve_hardware
    from homelab.units import format_size

    ref = parse_model_ref(args.model) or _from_catalogue(args.model)
    if ref is None:
        raise HubError(
            f"{args.model!r} is not a hub repo name.",
            hint="Use org/name or org/name:QUANT, e.g. unsloth/Qwen3-8B-GGUF:Q4_K_M, or a "
            "catalogue name (`homelab plan --help` lists them).",
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
        pulled = pull(ref, progress=sink, mmproj=not args.no_mmproj)
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


def _from_catalogue(name: str) -> HubRef | None:
    """A catalogue name's default repo with the quant the planner picks for this machine."""
    from homelab.errors import HomelabError
    from homelab.hub.quants import ModelRef
    from homelab.models.fetch import catalogue_pick
    from homelab.models.ref import catalogue_ref
    from homelab.planner.budget import resolve_hardware
    from homelab.planner.search import PlanRequest

    try:
        model = catalogue_ref(name)
    except HomelabError:
        return None
    quant = catalogue_pick(model, PlanRequest(), resolve_hardware())
    print(
        f"homelab: {name} is {model.entry.hf_repo}; the planner picks {quant} for this machine.",
        file=sys.stderr,
    )
    return ModelRef(model.entry.hf_repo, quant)
