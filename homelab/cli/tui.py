"""``homelab`` / ``homelab tui [MODEL]``: open the dashboard (``--json``: print its status).

Imports nothing heavy at module level: Textual, the planner and llama.cpp load in :func:`run`.
"""

from __future__ import annotations

import argparse
import json

from homelab.cli import flags
from homelab.engine.api import DEFAULT_TEMPERATURE


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(
        parser,
        optional=True,
        help=f"{flags.MODEL_HELP} (default: the first local model, else the trained demo)",
    )
    flags.add_download_flags(parser)
    flags.add_speculation_flags(parser)
    parser.add_argument(
        "--temperature",
        type=float,
        default=DEFAULT_TEMPERATURE,
        help=f"chat sampling temperature; 0 = greedy, the same answer every time "
        f"({DEFAULT_TEMPERATURE})",
    )
    parser.add_argument(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help="also plan and load over these llama.cpp RPC workers (`homelab worker`)",
    )
    parser.add_argument(
        "--rpc-budget",
        metavar="BYTES",
        help="memory each RPC worker device may hold (default: its free memory minus 256MiB)",
    )


def run(args: argparse.Namespace) -> int:
    if args.json:  # the status only: nothing is downloaded
        from homelab.tui.status import status_document

        print(json.dumps(status_document(args.model), indent=2))
        return 0
    from homelab.tui.app import make_app

    make_app(
        _downloaded(args),
        speculation=flags.speculation(args),
        chat_temperature=args.temperature,
        rpc=flags.rpc_endpoints(args),
        rpc_budget_bytes=flags.size(args.rpc_budget),
    ).run()
    return 0


def _downloaded(args: argparse.Namespace) -> str | None:
    """MODEL, downloaded first (plan shown, asked on the terminal) when it is not here."""
    if args.model is None:
        return None
    from homelab.models.ref import HubModel

    ref = flags.local_model(args)
    return ref.label if isinstance(ref, HubModel) else args.model
