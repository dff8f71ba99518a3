"""What ``homelab search`` does and prints: repo search, and one repo's GGUF files."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from homelab.errors import HubError
from homelab.hub.client import RepoListing, RepoSummary, repo_listing, search_repos
from homelab.hub.quants import GgufEntry, parse_model_ref
from homelab.hub.render import human_bytes, table
from homelab.hub.settings import hub_settings


def run_cli(
    query: str,
    *,
    limit: int,
    plan: bool,
    as_json: bool,
    gpu: str | None = None,
    vram: str | None = None,
) -> int:
    settings = hub_settings()
    ref = parse_model_ref(query)
    if ref is None:
        if plan:
            raise HubError("--plan needs a repo (org/name), not search words.")
        _print_search(query, search_repos(settings, query, limit), as_json)
        return 0
    listing = repo_listing(settings, ref.repo_id)
    if plan:
        from homelab.hub.matrix import print_matrix
        from homelab.planner.budget import resolve_hardware
        from homelab.units import parse_size

        hardware = resolve_hardware(gpu=gpu, vram_bytes=parse_size(vram) if vram else None)
        return print_matrix(settings, listing, hardware=hardware, as_json=as_json)
    _print_listing(listing, as_json)
    return 0


def _print_search(query: str, hits: list[RepoSummary], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"query": query, "repos": [asdict(hit) for hit in hits]}, indent=2))
        return
    if not hits:
        print(f"No GGUF repos match {query!r}.")
        return
    rows = [[h.repo_id, _count(h.downloads), _count(h.likes), h.updated or "?"] for h in hits]
    print(table(["REPO", ">DOWNLOADS", ">LIKES", "UPDATED"], rows))
    print(f"\nList a repo's files: homelab search {hits[0].repo_id}")


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def listing_document(listing: RepoListing) -> dict[str, Any]:
    return {
        "repo": listing.repo_id,
        "commit": listing.commit,
        "entries": [entry_document(e) for e in listing.entries],
        "projectors": [asdict(f) for f in listing.projectors],
    }


def entry_document(entry: GgufEntry) -> dict[str, Any]:
    return {
        "quant": entry.quant,
        "label": entry.label,
        "stem": entry.stem,
        "size_bytes": entry.total_bytes,
        "split": entry.is_split,
        "missing_parts": list(entry.missing_parts),
        "files": [asdict(f) for f in entry.files],
    }


def _print_listing(listing: RepoListing, as_json: bool) -> None:
    if as_json:
        print(json.dumps(listing_document(listing), indent=2))
        return
    print(f"{listing.repo_id} at {listing.commit[:12]}: {len(listing.entries)} GGUF model file(s)")
    if not listing.entries:
        return
    rows = [
        [e.label, human_bytes(e.total_bytes), str(len(e.files)), _file_note(e)]
        for e in listing.entries
    ]
    print(table(["QUANT", ">SIZE", ">FILES", "FILE"], rows))
    if listing.projectors:
        print("Vision projectors: " + ", ".join(f.path for f in listing.projectors))
    print(
        f"\nWhat fits here: homelab search {listing.repo_id} --plan   "
        f"Download: homelab pull {listing.repo_id}:{listing.entries[-1].label}"
    )


def _file_note(entry: GgufEntry) -> str:
    if entry.missing_parts:
        return f"{entry.first_path} (split set, INCOMPLETE: {len(entry.missing_parts)} missing)"
    return f"{entry.first_path} (split set)" if entry.is_split else entry.first_path
