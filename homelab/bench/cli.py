"""``homelab bench MODEL``: this machine's speed for the planned configuration, and the
concurrency × K/V-type table, saved as a hardware profile the planner predicts from.

1. pp512 / tg128 of the configuration ``homelab plan`` chooses for this weights file
   (a warm-up, then repeated runs: median and spread);
2. for each K/V type and concurrency 1…64 at a fixed context per request: "does not fit"
   where the planner says so, else aggregate decode tok/s, per-stream tok/s, TTFT p50/p95;
3. the figures are saved in ``data_dir()/profiles/``; the planner then reports
   ``predicted.basis = "measured"`` for these settings on this machine.

It refuses to run while a homelab server is running (see :mod:`homelab.lock`).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from homelab.bench.concurrency import ConcurrencyTable
    from homelab.bench.profile import SpeedResult
    from homelab.engine.engine import Engine
    from homelab.gguf.model import ModelInfo
    from homelab.planner.budget import Hardware
    from homelab.settings import Settings

DEFAULT_LEVELS = "1,2,4,8,16,32,64"
DEFAULT_KV_TYPES = "f16,q8_0,q4_0"
BUSY_LOAD_SHARE = 0.5  # warn when other processes already kept this share of the cores busy


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a GGUF file, or demo / demo:bench")
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


def run(args: argparse.Namespace) -> int:
    from homelab.lock import refuse_if_server_running

    refuse_if_server_running("benchmark")
    outcome = measure(args)
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
        return 0
    from homelab.bench.render import bench_report, print_all

    print_all(
        bench_report(outcome.speed, outcome.table, outcome.profile_path, outcome.busy_machine_note)
    )
    return 0


@dataclass(frozen=True)
class BenchOutcome:
    """What one ``homelab bench`` measured and where it saved the profile."""

    model_name: str
    model_path: str
    quant: str
    hardware_id: str
    budget_bytes: int | None
    plan_settings: Settings
    speed: SpeedResult | None
    table: ConcurrencyTable | None
    profile_path: str | None
    load_average: float  # 1-minute load average before starting (other processes' CPU use)
    cpu_count: int

    @property
    def busy_machine_note(self) -> str | None:
        if self.load_average <= BUSY_LOAD_SHARE * self.cpu_count:
            return None
        return (
            f"Other processes were using the CPU when the benchmark started (load average "
            f"{self.load_average:.1f} on {self.cpu_count} cores): the figures may be low and "
            "noisy. Run it again on a quiet machine, or with --repeat 3."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": {"name": self.model_name, "path": self.model_path, "quant": self.quant},
            "hardware_id": self.hardware_id,
            "budget_bytes": self.budget_bytes,
            "plan": self.plan_settings.to_dict(),
            "speed": self.speed.to_dict() if self.speed else None,
            "concurrency": self.table.to_dict() if self.table else None,
            "profile_path": self.profile_path,
            "load_average": self.load_average,
            "cpu_count": self.cpu_count,
            "warning": self.busy_machine_note,
        }


def measure(args: argparse.Namespace) -> BenchOutcome:
    from homelab.bench import planning
    from homelab.bench.profile import TG_PROMPT_TOKENS
    from homelab.gguf.reader import read_model

    _check_args(args)
    load_average, cpu_count = os.getloadavg()[0], len(os.sched_getaffinity(0))
    path = planning.resolve_model_path(args.model)
    info = read_model(path)
    budget = planning.parse_budget(args.budget)
    hardware = planning.bench_hardware(budget)
    hardware_id = planning.profile_hardware_id(hardware)
    min_ctx = max(args.pp + 1, TG_PROMPT_TOKENS + args.tg)
    settings = planning.planned(info, hardware, min_ctx).settings
    speed, table = None, None
    with _progress(args) as ticker:
        if args.only != "table":
            speed = _speed(args, path, settings, ticker)
        if args.only != "speed":
            table = _table(args, path, info, hardware, budget, ticker)
    saved = None
    if speed is not None and not args.no_save:
        saved = str(_save(info.name, path, hardware_id, speed, table))
    return BenchOutcome(
        model_name=info.name,
        model_path=str(path),
        quant=info.file_type,
        hardware_id=hardware_id,
        budget_bytes=budget,
        plan_settings=settings,
        speed=speed,
        table=table,
        profile_path=saved,
        load_average=load_average,
        cpu_count=cpu_count,
    )


def _check_args(args: argparse.Namespace) -> None:
    from homelab.errors import BenchError

    numbers = {"--pp": args.pp, "--tg": args.tg, "--reps": args.reps, "--repeat": args.repeat}
    numbers |= {"--ctx-per-request": args.ctx_per_request, "--prompt-tokens": args.prompt_tokens}
    numbers |= {"--gen-tokens": args.gen_tokens, "--threads": args.threads or 1}
    for flag, value in numbers.items():
        if value < 1:
            raise BenchError(f"{flag} must be at least 1 (got {value})")
    args.level_list = _int_list(args.levels, "--levels")
    args.kv_list = [kv.strip() for kv in args.kv_types.split(",") if kv.strip()]


def _int_list(text: str, flag: str) -> list[int]:
    from homelab.errors import BenchError

    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise BenchError(f"{flag} {text!r} is not a list of numbers", hint="e.g. 1,2,4,8") from None
    if not values or values[0] < 1:
        raise BenchError(f"{flag} needs numbers of at least 1 (got {text!r})")
    return values


def _progress(args: argparse.Namespace) -> Any:
    from homelab.bench.profile import WARMUPS
    from homelab.bench.render import progress_bar

    steps = 0
    if args.only != "table":
        steps += 2 * (WARMUPS + args.reps)
    if args.only != "speed":
        steps += len(args.kv_list) * len(args.level_list)
    return progress_bar(steps, "bench")


def _load(path: Path, settings: Settings, threads: int | None, queue_limit: int = 64) -> Engine:
    from dataclasses import replace

    from homelab.engine.engine import Engine

    if threads is not None:
        settings = replace(settings, n_threads=threads)
    # no OOM ladder: a benchmark must measure exactly the settings it names, or fail
    return Engine.load(path, settings, queue_limit=queue_limit, on_oom_ladder=False)


def _speed(args: argparse.Namespace, path: Path, settings: Settings, ticker: Any) -> SpeedResult:
    from homelab.bench.profile import measure_speed
    from homelab.bench.prompts import PromptSource

    engine = _load(path, settings, args.threads)
    try:
        prompts = PromptSource.from_tokenizer(lambda text: engine.tokenize(text, add_bos=False))
        return measure_speed(
            engine, prompts, prompt_tokens=args.pp, generated_tokens=args.tg,
            repetitions=args.reps, progress=ticker,
        )  # fmt: skip
    finally:
        engine.close()


def _table(
    args: argparse.Namespace,
    path: Path,
    info: ModelInfo,
    hardware: Hardware,
    budget: int | None,
    ticker: Any,
) -> ConcurrencyTable:
    from homelab.bench import planning
    from homelab.bench.concurrency import measure_table

    queue_limit = max(64, *args.level_list)
    return measure_table(
        planning.fit_check(info, hardware, args.ctx_per_request),
        lambda settings: _load(path, settings, args.threads, queue_limit),
        n_ctx_per_request=args.ctx_per_request,
        prompt_tokens=args.prompt_tokens,
        generated_tokens=args.gen_tokens,
        budget_bytes=budget,
        kv_types=args.kv_list,
        levels=args.level_list,
        repeats=args.repeat,
        progress=ticker,
    )


def _save(
    model_name: str,
    path: Path,
    hardware_id: str,
    speed: SpeedResult,
    table: ConcurrencyTable | None,
) -> Path:
    from homelab.bench import store
    from homelab.hardware.report import detect

    records = store.profile_records(
        model_name=model_name,
        model_path=str(path),
        hardware_id=hardware_id,
        hardware=store.hardware_summary(detect()),
        speed=speed,
        table=table,
    )
    return store.save_profile(records)
