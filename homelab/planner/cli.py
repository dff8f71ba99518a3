"""``homelab plan MODEL``: choose quant, KV types, context, slots and offload for a model.

MODEL is a local GGUF path or a catalogue name (``homelab plan llama-3.1-8b --gpu rtx-4090``
works offline). Without ``--gpu`` / ``--vram`` the plan is for this machine as detected.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from homelab.planner.search import PlanRequest
    from homelab.settings import Settings

GOALS = ("context", "quality", "throughput")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="MODEL", help="a GGUF file, or a catalogue name such as llama-3.1-8b"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gpu", metavar="PROFILE", help="plan for a GPU profile (e.g. rtx-4090)")
    where.add_argument("--vram", metavar="BYTES", help="plan for a GPU with this much VRAM (24GiB)")
    parser.add_argument("--no-verify", action="store_true", help="skip the llama.cpp dry run")
    add_plan_arguments(parser)


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The planning knobs, shared by ``plan`` and the verbs that plan before loading (serve)."""
    group = parser.add_argument_group("plan")
    group.add_argument(
        "--ram", metavar="BYTES", help="host RAM to plan with (default: this machine's)"
    )
    group.add_argument(
        "--ctx",
        metavar="N",
        help="context each request can use (tokens; 32k allowed); the minimum with --goal context",
    )
    group.add_argument(
        "--parallel", type=int, metavar="N", help="parallel slots (requests at once)"
    )
    group.add_argument(
        "--kv", metavar="TYPE", help="KV cache type: f16, q8_0, q4_0, or K/V like q8_0/f16"
    )
    group.add_argument("--quant", metavar="Q", help="weight quant to use (e.g. Q4_K_M)")
    group.add_argument(
        "--goal", choices=GOALS, default="context", help="what to optimise (default: context)"
    )
    group.add_argument(
        "--margin", metavar="BYTES", help="VRAM to leave free on each GPU (default 256MiB)"
    )
    group.add_argument(
        "--overhead", metavar="BYTES", help="CUDA runtime overhead per GPU (default: the profile's)"
    )
    group.add_argument(
        "--n-gpu-layers", type=int, metavar="N", help="fix the number of layers on the GPU"
    )
    group.add_argument(
        "--n-cpu-moe",
        type=int,
        metavar="N",
        help="keep the experts of the first N blocks on the CPU",
    )
    group.add_argument("--n-ubatch", type=int, metavar="N", help="fix the micro-batch size")
    group.add_argument("--no-flash-attn", action="store_true", help="plan without flash attention")


def run(args: argparse.Namespace) -> int:
    from homelab.planner.budget import resolve_hardware
    from homelab.planner.plan import plan_model
    from homelab.planner.render import render_plan

    hardware = resolve_hardware(
        gpu=args.gpu,
        vram_bytes=_size(args.vram),
        ram_bytes=_size(args.ram),
        margin_bytes=_size(args.margin),
        gpu_overhead_bytes=_size(args.overhead),
    )
    plan = plan_model(args.model, hardware, request_from_args(args), verify=not args.no_verify)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(render_plan(plan), end="")
    return 0 if plan.fits else 1


def settings_from_args(args: argparse.Namespace, model_path: Path) -> Settings:
    """Plan ``model_path`` (that file only) for this machine with the flags of
    :func:`add_plan_arguments`; the settings to load it with. Raises PlanError if nothing fits."""
    from homelab.gguf.reader import read_model
    from homelab.planner.budget import resolve_hardware
    from homelab.planner.plan import plan_model

    hardware = resolve_hardware(
        ram_bytes=_size(getattr(args, "ram", None)),
        margin_bytes=_size(getattr(args, "margin", None)),
        gpu_overhead_bytes=_size(getattr(args, "overhead", None)),
    )
    request = replace(request_from_args(args), quant=None)
    return plan_model(read_model(model_path), hardware, request).settings


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    from homelab.planner.rules import parse_kv
    from homelab.planner.search import PlanRequest

    return PlanRequest(
        goal=getattr(args, "goal", "context"),
        ctx=parse_tokens(args.ctx) if args.ctx else None,
        parallel=_positive(args.parallel, "--parallel"),
        kv=parse_kv(args.kv) if args.kv else None,
        quant=args.quant,
        n_gpu_layers=args.n_gpu_layers,
        n_cpu_moe=args.n_cpu_moe,
        flash_attn=False if args.no_flash_attn else None,
        n_ubatch=_positive(args.n_ubatch, "--n-ubatch"),
    )


def parse_tokens(text: str | int) -> int:
    """``8192``, ``32k`` (32768) or ``128K``."""
    from homelab.errors import PlanError

    cleaned = str(text).strip().lower()
    multiplier = 1024 if cleaned.endswith("k") else 1
    digits = cleaned.removesuffix("k")
    if not digits.isdigit() or int(digits) <= 0:
        raise PlanError(
            f"--ctx {text!r} is not a number of tokens.", hint="Write it like 8192 or 32k."
        )
    return int(digits) * multiplier


def _size(text: str | None) -> int | None:
    if text is None:
        return None
    from homelab.units import parse_size

    return parse_size(text)


def _positive(value: int | None, flag: str) -> int | None:
    if value is not None and value <= 0:
        from homelab.errors import PlanError

        raise PlanError(f"{flag} must be a positive number.")
    return value
