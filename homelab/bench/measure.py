"""What ``homelab bench`` measures: this machine's speed for the planned configuration, and the
concurrency × K/V-type table, saved as a hardware profile the planner predicts from.

1. pp512 / tg128 of the configuration ``homelab plan`` chooses for this weights file
   (a warm-up, then repeated runs: median and spread);
2. for each K/V type and concurrency 1…64 at a fixed context per request: "does not fit"
   where the planner says so, else aggregate decode tok/s, per-stream tok/s, TTFT p50/p95;
3. with ``--spec ngram`` / ``--draft MODEL``: the tg run plain and speculating, side by side
   (:mod:`homelab.bench.speculative`);
4. the figures are saved in ``data_dir()/profiles/``; the planner then reports
   ``predicted.basis = "measured"`` for these settings on this machine.

It refuses to run while a homelab server is running (see :mod:`homelab.lock`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from homelab.bench import concurrency
from homelab.errors import BenchError
from homelab.settings import COMPARED_KV_TYPES, KV_TYPES, Settings

if TYPE_CHECKING:
    from homelab.bench.concurrency import ConcurrencyTable, Progress
    from homelab.bench.profile import SpeedResult
    from homelab.bench.speculative import SpeculationResult
    from homelab.engine.engine import Engine
    from homelab.engine.speculation.config import SpeculationConfig
    from homelab.gguf.model import ModelInfo
    from homelab.planner.budget import Hardware

BUSY_LOAD_SHARE = 0.5  # warn when other processes already kept this share of the cores busy


@dataclass(frozen=True)
class BenchOptions:
    """What to measure (the ``homelab bench`` flags)."""

    budget_bytes: int | None = None  # instead of the machine's (see bench.planning)
    only: Literal["speed", "table"] | None = None
    save: bool = True
    threads: int | None = None
    pp: int = 512  # prompt tokens of the speed run
    tg: int = 128  # generated tokens of the speed run
    reps: int = 3  # measured runs after the warm-up
    ctx_per_request: int = 1024
    prompt_tokens: int = 128
    gen_tokens: int = 128
    levels: tuple[int, ...] = concurrency.CONCURRENCY_LEVELS
    kv_types: tuple[str, ...] = COMPARED_KV_TYPES
    repeat: int = 1  # runs per cell, median kept
    speculation: SpeculationConfig | None = None  # also measure tg with it, beside plain

    def check(self) -> None:
        numbers = {"--pp": self.pp, "--tg": self.tg, "--reps": self.reps, "--repeat": self.repeat}
        numbers |= {"--ctx-per-request": self.ctx_per_request}
        numbers |= {"--prompt-tokens": self.prompt_tokens, "--gen-tokens": self.gen_tokens}
        numbers |= {"--threads": self.threads or 1}
        for flag, value in numbers.items():
            if value < 1:
                raise BenchError(f"{flag} must be at least 1 (got {value})")
        if not self.levels or min(self.levels) < 1:
            raise BenchError(f"--levels needs numbers of at least 1 (got {self.levels})")
        if self.speculation is not None and self.only == "table":
            raise BenchError(
                "--spec / --draft measure the speed part, which --only table leaves out",
                hint="Drop --only table, or use --only speed.",
            )
        unknown = [kv for kv in self.kv_types if kv not in KV_TYPES]
        if unknown or not self.kv_types:
            raise BenchError(
                f"--kv-types: {', '.join(unknown) or 'none given'} is not a KV cache type",
                hint=f"Use some of {', '.join(KV_TYPES)}.",
            )

    @property
    def steps(self) -> int:
        """Progress steps: every speed run and table cell."""
        from homelab.bench.profile import WARMUPS

        steps = 0 if self.only == "table" else 2 * (WARMUPS + self.reps)
        if self.speculation is not None:
            steps += 2 * (WARMUPS + self.reps)
        if self.only != "speed":
            steps += len(self.kv_types) * len(self.levels)
        return steps


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
    speculation: SpeculationResult | None = None

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
            "speculation": self.speculation.to_dict() if self.speculation else None,
        }


def measure(path: Path, options: BenchOptions, progress: Progress | None = None) -> BenchOutcome:
    """Benchmark the weights file ``path`` (see the module docstring)."""
    from homelab.bench import planning
    from homelab.bench.profile import TG_PROMPT_TOKENS
    from homelab.gguf.reader import read_model
    from homelab.lock import refuse_if_server_running

    refuse_if_server_running("benchmark")
    options.check()
    load_average, cpu_count = os.getloadavg()[0], len(os.sched_getaffinity(0))
    info = read_model(path)
    hardware = planning.bench_hardware(options.budget_bytes)
    hardware_id = planning.profile_hardware_id(hardware)
    min_ctx = max(options.pp + 1, TG_PROMPT_TOKENS + options.tg)
    settings = planning.planned(info, hardware, min_ctx).settings
    speed = None if options.only == "table" else _speed(options, path, settings, progress)
    speculation = None
    if options.speculation is not None:
        speculation = _speculation(options, path, settings, options.speculation, progress)
    table = None
    if options.only != "speed":
        table = _table(options, path, info, hardware, progress)
    saved = None
    if speed is not None and options.save:
        saved = str(_save(info.name, path, hardware_id, speed, table))
    return BenchOutcome(
        model_name=info.name,
        model_path=str(path),
        quant=info.file_type,
        hardware_id=hardware_id,
        budget_bytes=options.budget_bytes,
        plan_settings=settings,
        speed=speed,
        table=table,
        profile_path=saved,
        load_average=load_average,
        cpu_count=cpu_count,
        speculation=speculation,
    )


def _load(path: Path, settings: Settings, threads: int | None, queue_limit: int = 64) -> Engine:
    from homelab.engine.engine import Engine

    if threads is not None:
        settings = replace(settings, n_threads=threads)
    # no OOM ladder: a benchmark must measure exactly the settings it names, or fail
    return Engine.load(path, settings, queue_limit=queue_limit, on_oom_ladder=False)


def _speed(
    options: BenchOptions, path: Path, settings: Settings, progress: Progress | None
) -> SpeedResult:
    from homelab.bench.profile import measure_speed
    from homelab.bench.prompts import PromptSource

    engine = _load(path, settings, options.threads)
    try:
        prompts = PromptSource.from_tokenizer(lambda text: engine.tokenize(text, add_bos=False))
        return measure_speed(
            engine, prompts, prompt_tokens=options.pp, generated_tokens=options.tg,
            repetitions=options.reps, progress=progress,
        )  # fmt: skip
    finally:
        engine.close()


def _speculation(
    options: BenchOptions,
    path: Path,
    settings: Settings,
    config: SpeculationConfig,
    progress: Progress | None,
) -> SpeculationResult:
    from homelab.bench.speculative import run_speculation

    return run_speculation(
        path,
        settings,
        config,
        threads=options.threads,
        generated_tokens=options.tg,
        repetitions=options.reps,
        progress=progress,
    )


def _table(
    options: BenchOptions,
    path: Path,
    info: ModelInfo,
    hardware: Hardware,
    progress: Progress | None,
) -> ConcurrencyTable:
    from homelab.bench import planning

    queue_limit = max(64, *options.levels)
    return concurrency.measure_table(
        planning.fit_check(info, hardware, options.ctx_per_request),
        lambda settings: _load(path, settings, options.threads, queue_limit),
        n_ctx_per_request=options.ctx_per_request,
        prompt_tokens=options.prompt_tokens,
        generated_tokens=options.gen_tokens,
        budget_bytes=options.budget_bytes,
        kv_types=list(options.kv_types),
        levels=list(options.levels),
        repeats=options.repeat,
        progress=progress,
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
