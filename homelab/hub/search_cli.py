"""``homelab search QUERY``: GGUF repos on the hub; ``homelab search ORG/NAME``: its files."""

from __future__ import annotations

import argparse


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
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--gpu", metavar="PROFILE", help="with --plan: plan for a GPU profile (e.g. rtx-4090)"
    )
    where.add_argument(
        "--vram", metavar="BYTES", help="with --plan: plan for a GPU with this much VRAM (24GiB)"
    )


def run(args: argparse.Namespace) -> int:
    from homelab.hub import search

    return search.run_cli(
        args.query,
        limit=args.limit,
        plan=args.plan,
        as_json=args.json,
        gpu=args.gpu,
        vram=args.vram,
    )
