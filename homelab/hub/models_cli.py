"""``homelab models``: local GGUF models (library folders + Hugging Face cache) and their fit."""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        dest="dirs",
        action="append",
        type=Path,
        default=[],
        help="also look in this folder (repeatable; HOMELAB_MODEL_DIRS sets them for good)",
    )
    parser.add_argument(
        "--no-fit", action="store_true", help="skip planning each model for this machine (faster)"
    )


def run(args: argparse.Namespace) -> int:
    from homelab.hub.models_command import run_models

    return run_models(args.dirs, with_fit=not args.no_fit, as_json=args.json)
