"""``homelab quality MODEL``: what the plan's K/V cache (and weights) cost in quality
(see :mod:`homelab.bench.plan_quality`).

MODEL is any form ``homelab plan`` takes; one that is not here yet is downloaded first, after
its plan (for ``--budget`` when given) is shown (see :mod:`homelab.models.fetch`).
``--reference`` is any form that has a file on this machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from homelab.cli import flags
from homelab.settings import COMPARED_KV_TYPES

DEFAULT_KV_TYPES = ",".join(COMPARED_KV_TYPES)


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(parser)
    parser.add_argument(
        "--text", metavar="FILE", help="UTF-8 text to read (default: a bundled essay)"
    )
    parser.add_argument("--ctx", type=int, default=512, help="tokens per chunk (512)")
    parser.add_argument("--chunks", type=int, metavar="N", help="read at most N chunks")
    parser.add_argument(
        "--kv-types", default=DEFAULT_KV_TYPES, help=f"K/V types to compare ({DEFAULT_KV_TYPES})"
    )
    parser.add_argument(
        "--reference",
        metavar="MODEL",
        help="reference weights (default: the most precise file beside MODEL)",
    )
    parser.add_argument("--budget", metavar="BYTES", help="plan with this much memory (e.g. 2GiB)")
    parser.add_argument("--no-save", action="store_true", help="do not keep the result")
    flags.add_download_flags(parser)


def run(args: argparse.Namespace) -> int:
    from homelab.bench.plan_quality import QualityOptions, measure_plan_quality
    from homelab.bench.planning import bench_hardware, parse_budget
    from homelab.bench.render import print_all, progress_bar, quality_report

    budget_bytes = parse_budget(args.budget)
    path = flags.local_model(args, hardware=bench_hardware(budget_bytes)).local_path()
    reference = flags.model_ref(args.reference).local_path() if args.reference else None
    options = QualityOptions(
        text=Path(args.text) if args.text else None,
        n_ctx=args.ctx,
        max_chunks=args.chunks,
        kv_types=tuple(kv.strip() for kv in args.kv_types.split(",") if kv.strip()),
        reference=reference,
        budget_bytes=budget_bytes,
        save=not args.no_save,
    )
    with progress_bar(None, "quality") as ticker:
        result, saved = measure_plan_quality(path, options, ticker.set)
    if args.json:
        print(json.dumps(result.to_dict() | {"saved_to": saved}, indent=2))
        return 0
    print_all(quality_report(result, saved))
    return 0
