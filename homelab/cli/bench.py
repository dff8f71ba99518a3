"""``homelab bench MODEL``: this machine's speed for the planned configuration and the
concurrency × K/V-type table, saved as a hardware profile (see :mod:`homelab.bench.measure`).

MODEL is any form ``homelab plan`` takes; one that is not here yet is downloaded first, after
its plan (for ``--budget`` when given) is shown (see :mod:`homelab.models.fetch`).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from homelab.cli import flags
from homelab.settings import COMPARED_KV_TYPES

if TYPE_CHECKING:
    from homelab.bench.measure import BenchOptions

DEFAULT_LEVELS = "1,2,4,8,16,32,64"
DEFAULT_KV_TYPES = ",".join(COMPARED_KV_TYPES)


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(parser)
    parser.add_argument(
        "--budget", metavar="BYTES", help="memory budget instead of the machine's (e.g. 512MiB)"
    )
    parser.add_argument("--only", choices=("speed", "table"), help="run one part only")
    parser.add_argument("--no-save", action="store_true", help="do not save the hardware profile")
    parser.add_argument(
        "--threads", type=int, metavar="N", help="llama.cpp CPU threads (default: its own)"
    )
    speed = parser.add_argument_group("speed of the planned configuration")
    speed.add_argument("--pp", type=int, default=512, help="prompt tokens (512)")
    speed.add_argument("--tg", type=int, default=128, help="generated tokens (128)")
    speed.add_argument("--reps", type=int, default=3, help="measured runs after the warm-up (3)")
    table = parser.add_argument_group("concurrency × K/V-type table")
    table.add_argument(
        "--ctx-per-request", type=int, default=1024, help="context of each request (1024)"
    )
    table.add_argument(
        "--prompt-tokens", type=int, default=128, help="prompt of each request (128)"
    )
    table.add_argument(
        "--gen-tokens", type=int, default=128, help="tokens each request generates (128)"
    )
    table.add_argument(
        "--levels", default=DEFAULT_LEVELS, help=f"concurrency levels ({DEFAULT_LEVELS})"
    )
    table.add_argument(
        "--kv-types", default=DEFAULT_KV_TYPES, help=f"K/V types ({DEFAULT_KV_TYPES})"
    )
    table.add_argument("--repeat", type=int, default=1, help="runs per cell, median kept (1)")
    flags.add_speculation_flags(parser)  # the tg run, plain and speculating side by side
    flags.add_download_flags(parser)


def run(args: argparse.Namespace) -> int:
    from homelab.bench.measure import measure
    from homelab.bench.planning import bench_hardware
    from homelab.bench.render import bench_report, print_all, progress_bar

    options = bench_options(args)
    options.check()
    hardware = bench_hardware(options.budget_bytes)
    path = flags.local_model(args, hardware=hardware).local_path()
    with progress_bar(options.steps, "bench") as ticker:
        outcome = measure(path, options, ticker)
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
        return 0
    report = bench_report(
        outcome.speed,
        outcome.table,
        outcome.profile_path,
        outcome.busy_machine_note,
        speculation=outcome.speculation,
    )
    print_all(report)
    return 0


def bench_options(args: argparse.Namespace) -> BenchOptions:
    from homelab.bench.measure import BenchOptions
    from homelab.bench.planning import parse_budget

    return BenchOptions(
        budget_bytes=parse_budget(args.budget),
        only=args.only,
        save=not args.no_save,
        threads=args.threads,
        pp=args.pp,
        tg=args.tg,
        reps=args.reps,
        ctx_per_request=args.ctx_per_request,
        prompt_tokens=args.prompt_tokens,
        gen_tokens=args.gen_tokens,
        levels=int_list(args.levels, "--levels"),
        kv_types=tuple(kv.strip() for kv in args.kv_types.split(",") if kv.strip()),
        repeat=args.repeat,
        speculation=flags.speculation(args),
    )


def int_list(text: str, flag: str) -> tuple[int, ...]:
    from homelab.errors import BenchError

    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise BenchError(f"{flag} {text!r} is not a list of numbers", hint="e.g. 1,2,4,8") from None
    if not values or values[0] < 1:
        raise BenchError(f"{flag} needs numbers of at least 1 (got {text!r})")
    return tuple(values)
