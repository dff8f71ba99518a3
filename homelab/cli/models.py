"""``homelab models``: local GGUF models (library folders + Hugging Face cache) and how each fits
this machine; the names it lists are MODEL names every verb accepts."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
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
    from homelab.hub.fit import Fit, fits_on_this_machine
    from homelab.hub.library import library_dirs, list_local_models
    from homelab.hub.render import format_models, models_document
    from homelab.hub.settings import hf_cache_dir
    from homelab.models.mmproj import find_mmproj

    models = [replace(m, mmproj=find_mmproj(m.path)) for m in list_local_models(args.dirs)]
    fits: list[Fit | None] = (
        [None] * len(models) if args.no_fit else fits_on_this_machine([m.info for m in models])
    )
    view = (models, fits, library_dirs(args.dirs), hf_cache_dir())
    print(json.dumps(models_document(*view), indent=2) if args.json else format_models(*view))
    return 0
