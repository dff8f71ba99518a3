"""Everything that loads llama.cpp, each in a fresh process (``python -m benchmarks.gpu.workers``).

The parent (:mod:`benchmarks.gpu.measure`) never loads llama.cpp: it holds no CUDA context, so
NVML's per-process figure of a worker is that worker's load alone, and a CUDA abort costs one
item, not the run. A worker reads one JSON job on stdin and prints one ``RESULT {...}`` line.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homelab.settings import Settings

if TYPE_CHECKING:
    from homelab.bench.prompts import PromptSource
    from homelab.engine.engine import Engine
    from homelab.gguf.model import ModelInfo

RESULT_PREFIX = "RESULT "
Job = dict[str, Any]


# --- helpers -----------------------------------------------------------------------------


def nvml_reading() -> dict[str, Any] | None:
    """This process's VRAM and the device's used memory on GPU 0 (None without NVML)."""
    from homelab.hardware.gpu import gpu_snapshot, our_process_vram_bytes

    snapshots = gpu_snapshot()
    if not snapshots:
        return None
    gpu = snapshots[0]
    return {
        "process_bytes": our_process_vram_bytes(gpu),
        "device_used_bytes": gpu.memory_used_bytes,
        "device_total_bytes": gpu.memory_total_bytes,
        "processes": [[p.pid, p.used_memory_bytes] for p in gpu.processes],
        "at_s": time.time(),
    }


def load_engine(path: str, settings: Settings, queue_limit: int = 64) -> Engine:
    """The engine with exactly ``settings``: no OOM ladder, no calibration record."""
    from homelab.engine.engine import Engine

    return Engine.load(
        path, settings, queue_limit=queue_limit, on_oom_ladder=False, record_calibration=False
    )


def engine_settings(
    info: ModelInfo, slots: int, ctx_per_slot: int, pair: tuple[str, str], gpu: bool
) -> Settings:
    """Flash attention, every layer on the GPU (none in CPU smoke mode), llama.cpp's batches."""
    return Settings(
        quant=info.file_type,
        n_ctx=ctx_per_slot * slots,
        n_ctx_per_slot=ctx_per_slot,
        n_parallel=slots,
        type_k=pair[0],
        type_v=pair[1],
        flash_attn=True,
        n_gpu_layers=info.n_layer + 1 if gpu else 0,
        n_batch=2048,
        n_ubatch=512,
    )


def prompt_source(engine: Engine) -> PromptSource:
    from homelab.bench.prompts import PromptSource

    return PromptSource.from_tokenizer(lambda text: engine.tokenize(text, add_bos=False))


def pad256(tokens: int) -> int:
    return -(-tokens // 256) * 256


# --- jobs --------------------------------------------------------------------------------


def prepare_models(job: Job) -> dict[str, Any]:
    """Quantize the generated models; report the llama.cpp build that will run them."""
    from benchmarks.gpu.models import BIG, SMOKE_BIG, quantize_all
    from homelab.hardware.build import read_build

    spec = SMOKE_BIG if job["smoke"] else BIG
    paths = quantize_all(Path(job["models"]), job["bench_size"], spec)
    import llama_cpp

    return {**paths, "build": asdict(read_build()), "llama_cpp_file": llama_cpp.__file__}


def memory_job(job: Job) -> dict[str, Any]:
    """Load with the plan's settings; NVML before, after load, after a first and a deep decode."""
    from homelab.bench.concurrency import run_concurrent
    from homelab.bench.profile import run_one

    settings = Settings(**job["settings"])
    readings = {"before": nvml_reading()}
    engine = load_engine(job["path"], settings, queue_limit=max(64, settings.n_parallel))
    try:
        readings["after_load"] = nvml_reading()
        prompts = prompt_source(engine)
        room = engine.n_ctx_per_slot - 16
        first = run_one(engine, prompts, min(job["first_prompt_tokens"], room), 8)
        readings["after_first_decode"] = nvml_reading()
        deep = run_one(engine, prompts, min(job["deep_prompt_tokens"], room), 8)
        readings["after_deep_decode"] = nvml_reading()
        if engine.n_slots > 1:
            run_concurrent(engine, prompts, engine.n_slots, 32, 8)
            readings["after_all_slots"] = nvml_reading()
        report = engine.load_report
        return {
            "buffers": asdict(report.buffers),
            "settings_loaded": report.settings.to_dict(),
            "n_ctx": report.n_ctx,
            "n_ctx_per_slot": report.n_ctx_per_slot,
            "n_slots": report.n_slots,
            "load_s": report.load_s,
            "rss_delta_bytes": report.rss_after_bytes - report.rss_before_bytes,
            "nvml": readings,
            "first_request": asdict(first),
            "deep_request": asdict(deep),
        }
    finally:
        engine.close()


def engine_speed_job(job: Job) -> dict[str, Any]:
    """pp512/tg128 with one slot, then aggregate decode with N slots and N streams; and for
    each, homelab's own µs per step between two decodes (benchmarks.decode_gaps): at GPU step
    times it is what separates the engine from llama.cpp's C++ loop."""
    from benchmarks.decode_gaps import between_decodes_us, time_decodes
    from homelab.bench.concurrency import aggregate_decode_tok_s, run_concurrent
    from homelab.bench.profile import measure_speed
    from homelab.gguf.reader import read_model

    info = read_model(job["path"])
    gpu, pair = job["gpu"], ("f16", "f16")
    room = pad256(max(job["pp_tokens"] + 1, 16 + job["tg_tokens"]) + 32)
    decodes = time_decodes()
    between: dict[str, float] = {}
    with load_engine(job["path"], engine_settings(info, 1, room, pair, gpu)) as engine:
        decodes.clear()
        single = measure_speed(
            engine,
            prompt_source(engine),
            prompt_tokens=job["pp_tokens"],
            generated_tokens=job["tg_tokens"],
            repetitions=job["repetitions"],
        )
        between["1"] = between_decodes_us(decodes)  # prefill decodes are longer, not gaps
    aggregate: dict[str, list[float]] = {}
    for streams in job["streams"]:
        settings = engine_settings(info, streams, job["ctx_per_slot"], pair, gpu)
        with load_engine(job["path"], settings, queue_limit=max(64, streams)) as engine:
            prompts = prompt_source(engine)
            run_concurrent(engine, prompts, streams, job["prompt_tokens"], 8)  # warm-up
            decodes.clear()
            aggregate[str(streams)] = [
                aggregate_decode_tok_s(
                    run_concurrent(
                        engine, prompts, streams, job["prompt_tokens"], job["gen_tokens"]
                    )
                )
                for _ in range(job["repetitions"])
            ]
            between[str(streams)] = between_decodes_us(decodes)
    return {"single": single.to_dict(), "aggregate_tok_s": aggregate, "between_us": between}


def engine_kv_job(job: Job) -> dict[str, Any]:
    """One K/V pair: pp512/tg128 from an empty cache, then a deep prompt and decode after it."""
    from homelab.bench.profile import measure_speed, run_one
    from homelab.gguf.reader import read_model

    info = read_model(job["path"])
    depth, pair = job["depth"], (job["type_k"], job["type_v"])
    room = max(depth, job["pp_tokens"]) + job["tg_tokens"] + 32
    settings = engine_settings(info, 1, pad256(room), pair, job["gpu"])
    with load_engine(job["path"], settings) as engine:
        prompts = prompt_source(engine)
        speed = measure_speed(
            engine,
            prompts,
            prompt_tokens=job["pp_tokens"],
            generated_tokens=job["tg_tokens"],
            repetitions=job["repetitions"],
        )
        deep = [
            run_one(engine, prompts, depth, job["tg_tokens"]) for _ in range(job["repetitions"])
        ]
    return {
        "type_k": pair[0],
        "type_v": pair[1],
        "speed": speed.to_dict(),
        "depth": depth,
        "deep_prefill_tok_s": [stats.prefill_tok_s for stats in deep],
        "deep_decode_tok_s": [stats.decode_tok_s for stats in deep],
    }


def table_job(job: Job) -> dict[str, Any]:
    """``homelab bench``'s concurrency × K/V table under a memory budget, through its own code."""
    from homelab.bench import planning
    from homelab.bench.concurrency import measure_table
    from homelab.gguf.reader import read_model

    info = read_model(job["path"])
    hardware = planning.bench_hardware(job["budget_bytes"])
    levels = job["levels"]
    table = measure_table(
        planning.fit_check(info, hardware, job["ctx_per_request"]),
        lambda settings: load_engine(job["path"], settings, queue_limit=max(64, *levels)),
        n_ctx_per_request=job["ctx_per_request"],
        prompt_tokens=job["prompt_tokens"],
        generated_tokens=job["gen_tokens"],
        budget_bytes=job["budget_bytes"],
        kv_types=job["kv_types"],
        levels=levels,
        repeats=job["repeats"],
        progress=lambda what: print(f"  table: {what}", file=sys.stderr, flush=True),
    )
    return table.to_dict()


JOBS: dict[str, Callable[[Job], dict[str, Any]]] = {
    "prepare_models": prepare_models,
    "memory": memory_job,
    "engine_speed": engine_speed_job,
    "engine_kv": engine_kv_job,
    "table": table_job,
}


def main() -> int:
    job = json.loads(sys.stdin.read())
    started = time.perf_counter()
    try:
        document: dict[str, Any] = {"ok": True, "value": JOBS[job["kind"]](job)}
    except Exception as error:  # reported to the parent, which records it and goes on
        document = {
            "ok": False,
            "error": f"{type(error).__name__}: {error}",
            "traceback": traceback.format_exc(limit=6),
        }
    document["seconds"] = round(time.perf_counter() - started, 3)
    document["pid"] = os.getpid()
    print(RESULT_PREFIX + json.dumps(document, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
