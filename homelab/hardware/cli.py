"""``homelab hw``: report GPUs, CPU, RAM and the llama.cpp build (``--json`` for scripts).

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
        return _print_profiles(as_json=args.json)
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


def _print_profiles(*, as_json: bool) -> int:
    from dataclasses import asdict

    from homelab.hardware.profiles import load_gpu_profiles

    profiles = load_gpu_profiles()
    if as_json:
        print(json.dumps({key: asdict(profile) for key, profile in profiles.items()}, indent=2))
        return 0
    for profile in profiles.values():
        print(
            f"{profile.id:<18} {profile.name:<26} {profile.vram_bytes / (1 << 30):>6.0f} GiB "
            f"{profile.bandwidth_gb_s:>7.0f} GB/s  cc {profile.compute_capability:<5}"
            f"{profile.fp16_tflops:>7.1f} TFLOPS"
        )
    return 0
