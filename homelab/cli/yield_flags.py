"""``homelab serve``'s yield flags: when to give the GPU back by itself, and how patiently.

Yield and resume on demand (``homelab yield`` / ``homelab resume``, ``POST /admin/yield``)
work without any of these; the automatic triggers are opt-in (see
:mod:`homelab.server.yield_watch` for what each one watches).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from homelab.cli import flags

if TYPE_CHECKING:
    from homelab.engine.prompt_cache.store import PromptCache
    from homelab.planner.budget import Hardware
    from homelab.planner.plan import Plan
    from homelab.server.fleet import Fleet
    from homelab.server.yield_watch import YieldTriggers
    from homelab.server.yielding import YieldController

DEFAULT_MARGIN = "1G"


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sharing the GPU (yield it to another program, resume)")
    group.add_argument(
        "--yield-on-pressure",
        nargs="?",
        const=DEFAULT_MARGIN,
        metavar="MARGIN",
        help="give the GPU back when another process's VRAM use leaves less than MARGIN free "
        f"({DEFAULT_MARGIN} without a value); resume when it is free again",
    )
    group.add_argument(
        "--yield-to",
        metavar="NAME,NAME…",
        help="give the GPU back while a process with one of these names runs (e.g. "
        "comfyui,steam); resume when it exits",
    )
    group.add_argument(
        "--sleep-after",
        metavar="DURATION",
        help="give the GPU back after this long without a request (e.g. 10m); the next "
        "request resumes (off)",
    )
    group.add_argument(
        "--yield-to-cpu",
        action="store_true",
        help="while yielded, keep serving MODEL from a CPU-only plan (slower, no VRAM); the "
        "resume goes back to the GPU plan",
    )
    group.add_argument(
        "--yield-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="running requests may finish this long before a yield ends them (10)",
    )
    group.add_argument(
        "--yield-wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="while yielded, a request waits this long for a resume, then gets 503 (30)",
    )


def triggers(args: argparse.Namespace) -> YieldTriggers:
    from homelab.server.fleet import parse_keep_alive
    from homelab.server.yield_watch import YieldTriggers

    names = tuple(n.strip() for n in (args.yield_to or "").split(",") if n.strip())
    sleep_s = parse_keep_alive(args.sleep_after) if args.sleep_after else None
    return YieldTriggers(
        pressure_margin_bytes=flags.size(args.yield_on_pressure),
        yield_to=names,
        sleep_after_s=sleep_s or None,
    )


def planning_hardware_now(args: argparse.Namespace, cache_ram_bytes: int) -> Hardware:
    """The machine as it is now (the VRAM free now), less the prompt cache's RAM."""
    from homelab.cli.prompt_cache import reserve_bytes

    return reserve_bytes(flags.hardware(args), cache_ram_bytes)


def controller(
    args: argparse.Namespace,
    residency: Any,
    hardware_fn: Callable[[], Hardware],
    prompt_cache: PromptCache | None,
) -> YieldController:
    """The server's yield controller, with its watcher when a trigger is on."""
    from homelab.server.yield_watch import YieldWatcher
    from homelab.server.yielding import YieldController

    made = YieldController(
        residency,
        hardware_fn,
        prompt_cache=prompt_cache,
        grace_s=args.yield_grace,
        wait_s=args.yield_wait,
    )
    wanted = triggers(args)
    if wanted.any:
        made.watcher = YieldWatcher(made, wanted)
    return made


def for_fleet(
    args: argparse.Namespace, fleet: Fleet, prompt_cache: PromptCache | None
) -> YieldController:
    from homelab.server.yield_targets import FleetResidency

    cache_bytes = prompt_cache.config.ram_budget_bytes if prompt_cache is not None else 0
    return controller(
        args,
        FleetResidency(fleet),
        lambda: planning_hardware_now(args, cache_bytes),
        prompt_cache,
    )


def for_model(
    args: argparse.Namespace,
    holder: Any,
    name: str,
    plan: Plan,
    plan_fn: Callable[[Hardware], Plan],
    load_fn: Callable[[Plan], Any],
    cache_ram_bytes: int,
    prompt_cache: PromptCache | None,
    cpu_plan_fn: Callable[[Hardware, Plan], Plan] | None = None,
) -> YieldController:
    """``serve MODEL``'s controller; ``cpu_plan_fn`` (with ``--yield-to-cpu``) plans the
    CPU-only engine a yield serves from."""
    from homelab.server.yield_targets import SingleResidency

    to_cpu = cpu_plan_fn if args.yield_to_cpu else None
    residency = SingleResidency(holder, name, plan, plan_fn, load_fn, to_cpu)
    return controller(
        args, residency, lambda: planning_hardware_now(args, cache_ram_bytes), prompt_cache
    )
