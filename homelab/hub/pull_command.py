"""What ``homelab pull`` does and prints."""

from __future__ import annotations

import json
import sys

from homelab.errors import HubError
from homelab.hub.client import repo_listing
from homelab.hub.progress import ProgressSink, SilentProgress
from homelab.hub.pull import PulledModel, pull
from homelab.hub.quants import ModelRef, parse_model_ref
from homelab.hub.render import TqdmProgress, human_bytes
from homelab.hub.settings import hub_settings


def run_pull(model: str, *, quiet: bool, as_json: bool) -> int:
    ref = parse_model_ref(model)
    if ref is None:
        raise HubError(
            f"{model!r} is not a hub repo name.",
            hint="Use org/name or org/name:QUANT, e.g. unsloth/Qwen3-8B-GGUF:Q4_K_M.",
        )
    if ref.selector is None:
        ref = _best_for_this_machine(ref)
    sink: ProgressSink = SilentProgress() if quiet else TqdmProgress()
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
    _report(pulled, as_json)
    return 0


def _best_for_this_machine(ref: ModelRef) -> ModelRef:
    """No quant given: the one the planner picks for this machine (headers read remotely)."""
    settings = hub_settings()
    if settings.offline:
        return ref  # pull() uses what is cached, or says why it cannot
    listing = repo_listing(settings, ref.repo_id)
    if len(listing.entries) <= 1:
        return ref
    from homelab.hub.matrix import best_entry
    from homelab.planner.budget import resolve_hardware

    entry = best_entry(settings, listing, resolve_hardware())
    print(
        f"homelab: no quant given; {entry.label} ({human_bytes(entry.total_bytes)}) fits this "
        f"machine best (see `homelab search {ref.repo_id} --plan`).",
        file=sys.stderr,
    )
    return ModelRef(ref.repo_id, entry.label)


def _report(pulled: PulledModel, as_json: bool) -> None:
    for note in pulled.notes:
        print(f"homelab: {note}", file=sys.stderr)
    if as_json:
        document = {
            "repo": pulled.repo_id,
            "commit": pulled.commit,
            "quant": pulled.quant,
            "paths": [str(p) for p in pulled.paths],
            "size_bytes": pulled.total_bytes,
            "downloaded_bytes": pulled.downloaded_bytes,
            "from_cache_only": pulled.from_cache_only,
            "notes": list(pulled.notes),
        }
        print(json.dumps(document, indent=2))
        return
    fetched = (
        f"downloaded {human_bytes(pulled.downloaded_bytes)}, verified"
        if pulled.downloaded_bytes
        else "already downloaded"
    )
    print(f"{pulled.repo_id}:{pulled.quant} ({human_bytes(pulled.total_bytes)}, {fetched})")
    print(pulled.path)
    print(f"\nNext: homelab plan {pulled.repo_id}:{pulled.quant}")
