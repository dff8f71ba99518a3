"""``homelab`` / ``homelab tui [MODEL]``: open the dashboard (``--json``: print its status).

Imports nothing heavy at module level: Textual, the planner and llama.cpp load in :func:`run`.
"""

from __future__ import annotations

import argparse
import json

from homelab.cli import flags


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(
        parser,
        optional=True,
        help=f"{flags.MODEL_HELP} (default: the first local model, else the generated demo)",
    )


def run(args: argparse.Namespace) -> int:
    if args.json:
        from homelab.tui.status import status_document

        print(json.dumps(status_document(args.model), indent=2))
        return 0
    from homelab.tui.app import make_app

    make_app(args.model).run()
    return 0
