"""``homelab hw``: report GPUs, CPU, RAM and the llama.cpp build (``--json`` for scripts);
``--profiles``: the GPU profiles the planner knows.

Imports nothing heavy at module level: the report (NVML, psutil, llama.cpp) loads in :func:`run`.
"""

from __future__ import annotations

import argparse
import json
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profiles",
        action="store_true",
        help="list the GPU profiles the planner knows (for `homelab plan --gpu ID`)",
    )


def run(args: argparse.Namespace) -> int:
    if args.profiles:
        return _profiles(as_json=args.json)
    from homelab.hardware.render import format_report
    from homelab.hardware.report import detect

    report = detect()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        for warning in report.warnings:
            print(f"homelab: WARNING: {warning}", file=sys.stderr)
    else:
        print(format_report(report))
    return 0


def _profiles(*, as_json: bool) -> int:
    from dataclasses import asdict

    from homelab.hardware.profiles import load_gpu_profiles
    from homelab.hardware.render import format_profiles

    profiles = load_gpu_profiles()
    if as_json:
        print(json.dumps({key: asdict(profile) for key, profile in profiles.items()}, indent=2))
    else:
        print(format_profiles(profiles))
    return 0
