"""``homelab search WORDS``: GGUF repos on the hub; ``homelab search ORG/NAME``: its files;
``--plan``: which quant and KV type of the repo fit this machine (headers read remotely)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from homelab.cli import flags

if TYPE_CHECKING:
    from homelab.hub.client import RepoListing


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "query", help="words to search for, or a repo (org/name) to list its GGUF files"
    )
    parser.add_argument(
        "--limit", type=int, default=20, help="at most this many repos (default 20)"
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="for a repo: read each file's header remotely (no download) and show "
        "which quant and KV type fit this machine",
    )
    flags.add_target_hardware(parser, prefix="with --plan: ")


def run(args: argparse.Namespace) -> int:
    from homelab.errors import HubError
    from homelab.hub import render, search
    from homelab.hub.quants import parse_model_ref

    ref = parse_model_ref(args.query)
    if ref is None:
        if args.plan:
            raise HubError("--plan needs a repo (org/name), not search words.")
        hits = search.find_repos(args.query, args.limit)
        document = render.search_document(args.query, hits)
        _print(document, render.format_search(args.query, hits), args)
        return 0
    listing = search.repo_files(ref.repo_id)
    if args.plan:
        return _print_matrix(listing, args)
    _print(render.listing_document(listing), render.format_listing(listing), args)
    return 0


def _print_matrix(listing: RepoListing, args: argparse.Namespace) -> int:
    from homelab.hub.matrix import build_matrix, render_matrix
    from homelab.hub.settings import hub_settings

    matrix = build_matrix(hub_settings(), listing, flags.hardware(args))
    if args.json:
        print(json.dumps(matrix.to_dict(), indent=2))
    else:
        print(render_matrix(matrix), end="")
    return 0 if matrix.best is not None else 1


def _print(document: dict[str, Any], text: str, args: argparse.Namespace) -> None:
    print(json.dumps(document, indent=2) if args.json else text)
