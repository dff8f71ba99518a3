"""The H200 measurements: planner truth on real VRAM, engine speed against llama.cpp's own tools,
and the concurrency × K/V table under a memory budget. README.md beside this says how to run it.

    python -m benchmarks.gpu.measure generate --models DIR          # F16 files (no llama.cpp)
    python -m benchmarks.gpu.measure run --models DIR --tools DIR --out results.json \\
        --deadline EPOCH_SECONDS                                    # on the GPU machine
    python -m benchmarks.gpu.measure run --cpu-smoke --models DIR --out smoke.json   # here

Sections run in order of value (memory, speed, kv_speed, table); each item in its own worker
process (:mod:`benchmarks.gpu.workers`) with a timeout cut to the deadline, each failure recorded
and skipped. ``results.json`` is rewritten after every item, so a run stopped at its limit still
leaves everything measured so far.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu.models import BIG, SMOKE_BIG, generate_f16
from benchmarks.gpu.workers import RESULT_PREFIX
from homelab.gguf.generator import ArchSpec

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
GIB = 1 << 30
MIN_ITEM_S = 8.0  # don't start an item with less time than this left
TOOLS_WAIT_S = 150.0  # longest wait for the background tools build
PARTIAL_DEEP_TOKENS = 4096  # with layers on the CPU a deep prompt is slow: keep it short


# --- what to measure -----------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryCase:
    """One plan whose prediction is checked against a real load."""

    label: str
    model: str  # "bench" or "big"
    ctx: int  # per slot
    parallel: int
    kv: str
    gpu_layers: int | None = None  # None: every layer on the GPU


@dataclass(frozen=True)
class RunConfig:
    smoke: bool
    bench_size: str
    big: ArchSpec
    memory_cases: tuple[MemoryCase, ...]
    first_prompt_tokens: int
    deep_prompt_tokens: int
    pp_tokens: int  # llama-bench -p and the engine's prefill test
    tg_tokens: int  # llama-bench -n and the engine's decode test
    speed_streams: tuple[int, ...]
    speed_repetitions: int
    kv_pairs: tuple[tuple[str, str], ...]
    kv_tool_pairs: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]  # llama-bench -ctk × -ctv
    kv_depth: int
    kv_repetitions: int
    table_budget_bytes: int
    table_ctx: int
    table_levels: tuple[int, ...]
    table_prompt_tokens: int
    table_gen_tokens: int
    limits_s: dict[str, float] = field(default_factory=dict)
    serving_clients: tuple[int, ...] = (1, 8, 16)
    serving_rounds: int = 3


def _kv_cases(model: str, ctx: int, parallel: int, partial_layers: int) -> list[MemoryCase]:
    name = f"{model} {parallel}×{ctx // 1024}k"
    cases = [MemoryCase(f"{name} {kv}", model, ctx, parallel, kv) for kv in ("f16", "q8_0", "q4_0")]
    partial = MemoryCase(
        f"{model} 2×{ctx // 2048}k q8_0, {partial_layers} GPU layers",
        model, ctx // 2, 2, "q8_0", partial_layers,
    )  # fmt: skip
    return [*cases, partial]


GPU_CONFIG = RunConfig(
    smoke=False,
    bench_size="bench",
    big=BIG,
    memory_cases=(*_kv_cases("big", 32768, 4, 12), *_kv_cases("bench", 8192, 8, 6)),
    first_prompt_tokens=1024,
    deep_prompt_tokens=32768,
    pp_tokens=512,
    tg_tokens=128,
    speed_streams=(8, 16, 64),
    speed_repetitions=3,
    kv_pairs=(("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16")),
    kv_tool_pairs=((("f16", "q8_0"), ("f16", "q8_0")), (("q4_0",), ("q4_0",))),
    kv_depth=8192,
    kv_repetitions=2,
    table_budget_bytes=8 * GIB,
    table_ctx=4096,
    table_levels=(1, 2, 4, 8, 16, 32, 64),
    table_prompt_tokens=128,
    table_gen_tokens=64,
    limits_s={
        "prepare": 150,
        "memory": 60,
        "tool": 90,
        "engine_speed": 120,
        "kv": 60,
        "table": 200,
        "serving": 150,
    },
)

SMOKE_CONFIG = RunConfig(
    smoke=True,
    bench_size="tiny",
    big=SMOKE_BIG,
    memory_cases=(
        MemoryCase("tiny 2×1k f16", "bench", 1024, 2, "f16"),
        MemoryCase("tiny 2×1k q4_0", "bench", 1024, 2, "q4_0"),
        MemoryCase("smoke-big 1×2k q8_0, 3 GPU layers", "big", 2048, 1, "q8_0", 3),
    ),
    first_prompt_tokens=256,
    deep_prompt_tokens=900,
    pp_tokens=64,
    tg_tokens=16,
    speed_streams=(2, 4),
    speed_repetitions=1,
    kv_pairs=(("f16", "f16"), ("q8_0", "f16")),
    kv_tool_pairs=((("f16", "q8_0"), ("f16", "q8_0")),),
    kv_depth=512,
    kv_repetitions=1,
    table_budget_bytes=64 * MIB,
    table_ctx=512,
    table_levels=(1, 2, 64),
    table_prompt_tokens=32,
    table_gen_tokens=8,
    limits_s={
        "prepare": 120,
        "memory": 120,
        "tool": 60,
        "engine_speed": 240,
        "kv": 120,
        "table": 240,
        "serving": 300,
    },
    serving_clients=(1, 2),
    serving_rounds=2,
)


# --- the run's state -----------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Results:
    """The results document, rewritten (atomically) after every item."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"errors": [], "skipped": [], "timing_s": {}}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(partial, self.path)

    def error(self, where: str, message: str) -> None:
        log(f"FAILED {where}: {message.splitlines()[-1] if message else ''}")
        self.data["errors"].append({"where": where, "error": message[-4000:]})
        self.save()

    def skip(self, where: str, why: str) -> None:
        log(f"skipped {where}: {why}")
        self.data["skipped"].append({"where": where, "why": why})
        self.save()


@dataclass
class Run:
    config: RunConfig
    results: Results
    deadline: float
    models_dir: Path
    tools_dir: Path | None
    tools_ready: Path | None = None  # marker file the background tools build writes when done
    models: dict[str, str] = field(default_factory=dict)  # "bench"/"big" -> Q8_0 path
    hardware: Any = None

    def time_left(self) -> float:
        return self.deadline - time.time()

    def budget(self, kind: str) -> float | None:
        """Seconds the next item may take, or None when there is not enough time left."""
        left = self.time_left() - 3.0
        if left < MIN_ITEM_S:
            return None
        return min(self.config.limits_s.get(kind, 60.0), left)


# --- workers and tools ---------------------------------------------------------------------


class ItemFailed(Exception):
    pass


LIMIT_OF_JOB = {"prepare_models": "prepare", "memory": "memory", "engine_speed": "engine_speed",
                "engine_kv": "kv", "table": "table"}  # fmt: skip


def call_worker(run: Run, where: str, kind: str, job: dict[str, Any]) -> dict[str, Any]:
    """Run one worker job; its result, or ItemFailed (timeout, crash, Python error)."""
    timeout_s = run.budget(LIMIT_OF_JOB[kind])
    if timeout_s is None:
        raise ItemFailed("out of time")
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.gpu.workers"],
            input=json.dumps({"kind": kind, **job}),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as expired:
        _log_stderr(where, _text(expired.stderr))
        raise ItemFailed(f"timed out after {timeout_s:.0f} s") from None
    _log_stderr(where, done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])
        raise ItemFailed(f"worker exited {done.returncode} without a result: {tail}")
    document = json.loads(lines[-1][len(RESULT_PREFIX) :])
    if not document["ok"]:
        raise ItemFailed(f"{document['error']}\n{document.get('traceback', '')}")
    log(f"{where}: {time.perf_counter() - started:.1f} s")
    return dict(document["value"])


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def _log_stderr(where: str, text: str) -> None:
    interesting = [line for line in text.splitlines() if line.strip()][-12:]
    for line in interesting:
        print(f"    [{where}] {line}", file=sys.stderr)


def run_tool(run: Run, name: str, args: list[str]) -> dict[str, Any]:
    """One llama.cpp tool run with JSON output; its records and the exact command."""
    if run.tools_dir is None or not (run.tools_dir / name).is_file():
        raise ItemFailed(f"{name} was not built (no {run.tools_dir}/{name})")
    timeout_s = run.budget("tool")
    if timeout_s is None:
        raise ItemFailed("out of time")
    command = [str(run.tools_dir / name), *args]
    library_path = f"{run.tools_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "LD_LIBRARY_PATH": library_path},
        )
    except subprocess.TimeoutExpired:
        raise ItemFailed(f"{name} timed out after {timeout_s:.0f} s") from None
    records = _json_records(done.stdout)
    if done.returncode != 0 or not records:
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise ItemFailed(f"{name} exited {done.returncode} with {len(records)} records: {tail}")
    seconds = time.perf_counter() - started
    log(f"{name}: {seconds:.1f} s")
    return {
        "command": shlex.join([name, *[_short(arg) for arg in args]]),
        "seconds": round(seconds, 2),
        "records": records,
        "device_lines": [line for line in done.stderr.splitlines() if "Device 0" in line][:2],
    }


def wait_for_tools(run: Run) -> None:
    """The tools build in the background while the memory section runs; wait for its marker."""
    if run.tools_ready is None or run.tools_ready.exists():
        return
    log(f"waiting for the llama.cpp tools build ({run.tools_ready})")
    give_up = time.time() + max(0.0, min(TOOLS_WAIT_S, run.time_left() - 60))
    while not run.tools_ready.exists() and time.time() < give_up:
        time.sleep(1.0)


def _json_records(stdout: str) -> list[dict[str, Any]]:
    text = stdout.strip()
    if text.startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _short(arg: str) -> str:
    return Path(arg).name if arg.endswith(".gguf") else arg


def item(run: Run, where: str, action: Callable[[], Any]) -> Any:
    """Run one item: record its failure and go on (None) instead of stopping the run."""
    started = time.perf_counter()
    try:
        return action()
    except ItemFailed as failure:
        if str(failure) == "out of time":
            run.results.skip(where, "out of time")
        else:
            run.results.error(where, str(failure))
    except Exception:
        run.results.error(where, traceback.format_exc(limit=6))
    finally:
        run.results.data["timing_s"][where] = round(time.perf_counter() - started, 2)
    return None


# --- section 0: models and hardware ----------------------------------------------------------


def prepare(run: Run) -> None:
    job = {"models": str(run.models_dir), "bench_size": run.config.bench_size}
    value = call_worker(run, "prepare models", "prepare_models", {**job, "smoke": run.config.smoke})
    run.models = {"bench": value["bench"], "big": value["big"]}
    run.results.data["build"] = value["build"]
    run.results.data["models"] = {name: _model_facts(path) for name, path in run.models.items()}
    run.hardware = planning_hardware(run.config.smoke)
    run.results.data["hardware"] = _hardware_dict(run.hardware)
    run.results.save()


def planning_hardware(smoke: bool) -> Any:
    """This machine as the planner sees it, from NVML; the parent never loads llama.cpp, so on
    the GPU machine the build is described (CUDA) instead of probed."""
    from homelab.hardware.build import BuildInfo
    from homelab.hardware.report import detect
    from homelab.planner.budget import hardware_from_report

    build = None if smoke else BuildInfo("0.3.36", True, "CUDA (built for sm_90)", ("CUDA", "CPU"))
    return hardware_from_report(detect(build=build))


def _hardware_dict(hardware: Any) -> dict[str, Any]:
    return {
        "source": hardware.source,
        "devices": [asdict(device) for device in hardware.devices],
        "notes": list(hardware.notes),
    }


def _model_facts(path: str) -> dict[str, Any]:
    from homelab.gguf.reader import read_model

    info = read_model(path)
    return {
        "path": path,
        "file": Path(path).name,
        "file_type": info.file_type,
        "file_bytes": info.file_bytes,
        "n_params": info.n_params,
        "n_layer": info.n_layer,
        "n_embd": info.n_embd,
        "n_head": info.n_head[0] if info.n_head else 0,
        "n_head_kv": info.n_head_kv[0] if info.n_head_kv else 0,
        "n_vocab": info.n_vocab,
        "context_length": info.context_length,
    }


# --- section 1: planner truth -----------------------------------------------------------------


def plan_case(run: Run, case: MemoryCase) -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings, predicted memory) the planner gives for ``case`` with every knob fixed."""
    from homelab.gguf.reader import read_model
    from homelab.planner.plan import plan_model
    from homelab.planner.search import PlanRequest

    info = read_model(run.models[case.model])
    full = info.n_layer + 1
    request = PlanRequest(
        goal="throughput",
        ctx=case.ctx,
        parallel=case.parallel,
        kv=(case.kv, case.kv),
        flash_attn=True,
        n_gpu_layers=full if case.gpu_layers is None else case.gpu_layers,
        n_ubatch=512,
    )
    plan = plan_model(info, run.hardware, request, verify=False)
    return plan.settings.to_dict(), plan.memory.to_dict()


def memory_section(run: Run) -> None:
    cases = run.results.data.setdefault("memory", [])
    for case in run.config.memory_cases:
        where = f"memory: {case.label}"
        found = item(run, where, lambda case=case, where=where: memory_item(run, case, where))
        if found is not None:
            cases.append(found)
            run.results.save()


def memory_item(run: Run, case: MemoryCase, where: str) -> dict[str, Any]:
    settings, predicted = plan_case(run, case)
    job = {
        "path": run.models[case.model],
        "settings": settings,
        "first_prompt_tokens": run.config.first_prompt_tokens,
        "deep_prompt_tokens": run.config.deep_prompt_tokens
        if case.gpu_layers is None
        else min(run.config.deep_prompt_tokens, PARTIAL_DEEP_TOKENS),
    }
    actual = call_worker(run, where, "memory", job)
    return {
        "case": asdict(case),
        "settings": settings,
        "predicted": predicted,
        "actual": actual,
        "components": compare_components(predicted, actual),
    }


def buffer_device(name: str) -> str:
    """The planner device a llama.cpp buffer name belongs to: ``CUDA0``, ``CUDA0_…`` -> CUDA0;
    ``CPU``, ``CPU_Mapped``, ``CPU_REPACK`` and ``CUDA_Host`` (pinned host RAM) -> CPU."""
    gpu = re.match(r"CUDA\d+", name)
    return gpu.group(0) if gpu else "CPU"


def actual_by_device(buffers: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    kinds = {"model": "weights", "kv": "kv", "recurrent": "recurrent"}
    kinds |= {"compute": "compute", "output": "output"}
    found: dict[str, dict[str, int]] = {}
    for kind, component in kinds.items():
        for name, n_bytes in buffers.get(kind, {}).items():
            device = found.setdefault(buffer_device(name), dict.fromkeys(kinds.values(), 0))
            device[component] += int(n_bytes)
    return found


def _row(device: str, component: str, predicted: int, actual: int | None, note: str = "") -> dict:
    error = None if actual is None else predicted - actual
    pct = None if not actual else round(100.0 * (predicted - actual) / actual, 2)
    return {
        "device": device,
        "component": component,
        "predicted_bytes": predicted,
        "actual_bytes": actual,
        "error_bytes": error,
        "error_pct": pct,
        "note": note,
    }


def compare_components(predicted: dict[str, Any], actual: dict[str, Any]) -> list[dict[str, Any]]:
    """Predicted vs real bytes per device and component (weights, kv, compute, overhead, total)."""
    by_device = actual_by_device(actual["buffers"])
    rows = []
    for device in predicted["devices"]:
        name = device["name"]
        real = by_device.get(name, {})
        for component in ("weights", "kv", "compute"):
            rows.append(_row(name, component, device[f"{component}_bytes"], real.get(component, 0)))
        if device["kind"] == "gpu":
            rows += _gpu_rows(name, device, sum(real.values()), actual["nvml"])
        else:
            rows.append(
                _row(name, "overhead", device["overhead_bytes"], real.get("output", 0),
                     "logits: output buffer")
            )  # fmt: skip
    return rows


NVML_STAGES = ("after_load", "after_first_decode", "after_deep_decode", "after_all_slots")


def _gpu_rows(
    name: str, device: dict[str, Any], buffers_bytes: int, nvml: dict[str, Any]
) -> list[dict[str, Any]]:
    """Overhead (NVML's per-process figure minus llama.cpp's buffers) and the total, per stage."""
    rows = []
    for stage in NVML_STAGES:
        used = _process_bytes(nvml, stage)
        if used is None:
            continue
        rows.append(
            _row(name, "overhead", device["overhead_bytes"], used - buffers_bytes,
                 f"NVML {stage.replace('_', ' ')} minus llama.cpp buffers")
        )  # fmt: skip
        rows.append(
            _row(name, "total", device["total_bytes"], used, f"NVML {stage.replace('_', ' ')}")
        )
    return rows


def _process_bytes(nvml: dict[str, Any], stage: str) -> int | None:
    """This worker's VRAM at ``stage``; the device's growth since before the load if NVML
    hides per-process figures (some containers)."""
    reading, before = nvml.get(stage), nvml.get("before")
    if not reading:
        return None
    if reading.get("process_bytes") is not None:
        return int(reading["process_bytes"])
    if before:
        return int(reading["device_used_bytes"]) - int(before["device_used_bytes"])
    return None


# --- section 2: engine speed vs llama.cpp's tools ---------------------------------------------


def speed_section(run: Run) -> None:
    speed = run.results.data.setdefault("speed", {})
    bench, pp, tg = run.models["bench"], str(run.config.pp_tokens), str(run.config.tg_tokens)
    wait_for_tools(run)
    speed["llama_bench"] = item(run, "speed: llama-bench", lambda: run_tool(run, "llama-bench", [
        "-m", bench, "-ngl", "99", "-fa", "1", "-p", pp, "-n", tg, "-r", "3", "-o", "json",
    ]))  # fmt: skip
    run.results.save()
    streams = run.config.speed_streams
    ctx = 256 * max(streams)  # 256 cells per sequence, as the engine's slots below
    speed["batched_bench"] = item(run, "speed: llama-batched-bench", lambda: run_tool(
        run, "llama-batched-bench", [
            "-m", bench, "-ngl", "99", "-fa", "on", "-c", str(ctx), "-npp", "32", "-ntg", tg,
            "-npl", ",".join(str(n) for n in (1, *streams)), "-no-kvu",
            "--output-format", "jsonl",
        ]))  # fmt: skip
    run.results.save()
    job = {
        "path": bench,
        "gpu": not run.config.smoke,
        "streams": list(streams),
        "ctx_per_slot": 256,
        "prompt_tokens": 32,
        "gen_tokens": run.config.tg_tokens,
        "pp_tokens": run.config.pp_tokens,
        "tg_tokens": run.config.tg_tokens,
        "repetitions": run.config.speed_repetitions,
    }
    speed["engine"] = item(
        run, "speed: engine", lambda: call_worker(run, "speed: engine", "engine_speed", job)
    )
    run.results.save()


# --- section 3: K/V cache type speed -------------------------------------------------------


def kv_section(run: Run) -> None:
    kv = run.results.data.setdefault("kv_speed", {"llama_bench": [], "engine": []})
    big, depth = run.models["big"], run.config.kv_depth
    pp, tg = str(run.config.pp_tokens), str(run.config.tg_tokens)
    wait_for_tools(run)
    for type_k, type_v in run.config.kv_tool_pairs:
        where = f"kv: llama-bench -ctk {','.join(type_k)} -ctv {','.join(type_v)}"
        args = [
            "-m", big, "-ngl", "99", "-fa", "1", "-p", pp, "-n", tg, "-d", f"0,{depth}",
            "-ctk", ",".join(type_k), "-ctv", ",".join(type_v),
            "-r", str(run.config.kv_repetitions), "-o", "json",
        ]  # fmt: skip
        found = item(run, where, lambda args=args: run_tool(run, "llama-bench", args))
        if found is not None:
            kv["llama_bench"].append(found)
            run.results.save()
    for pair in run.config.kv_pairs:
        where = f"kv: engine {pair[0]}/{pair[1]}"
        job = {
            "path": big,
            "gpu": not run.config.smoke,
            "type_k": pair[0],
            "type_v": pair[1],
            "depth": depth,
            "pp_tokens": run.config.pp_tokens,
            "tg_tokens": run.config.tg_tokens,
            "repetitions": run.config.kv_repetitions,
        }
        found = item(
            run, where, lambda job=job, where=where: call_worker(run, where, "engine_kv", job)
        )
        if found is not None:
            kv["engine"].append(found)
            run.results.save()


# --- section 5: serving (homelab serve vs llama-server) and TTFT ----------------------------


def serving_section(run: Run) -> None:
    """The comparisons ``benchmarks.server_bench`` and ``benchmarks.step_bench --ttft-only``
    make on this CPU, on the big model with every layer on the GPU: 1/8/16 clients streaming
    and not, and the TTFT of 2K/8K/32K-token prompts, against llama-server of the same build;
    and ``benchmarks.sampling_bench`` (greedy picks: sampler per sequence vs one argmax;
    sampled picks: the whole vocabulary vs its top-k first)."""
    serving = run.results.data.setdefault("serving", {})
    wait_for_tools(run)
    big, tools = run.models["big"], str(run.tools_dir)
    clients = ",".join(str(n) for n in run.config.serving_clients)
    benches = {
        # one request a client a round, as planned for the device's time: a GPU's request of
        # the big model takes ~1 s, not the tiny model's ~0.1 s that wants eight a round here
        "server_bench": ["benchmarks.server_bench", "--model", big, "--concurrency", clients,
                         "--rounds", str(run.config.serving_rounds), "--max-tokens", "128",
                         "--threads", "4", "--min-idle", "0", "--min-requests", "1"],
        "ttft": ["benchmarks.step_bench", "--ttft-only", "--ttft-model", big,
                 "--rounds", str(run.config.serving_rounds), "--threads", "4", "--min-idle", "0"],
        # greedy picks per batch vs per sequence, on the host as on any GPU box (~1 min)
        "sampling": ["benchmarks.sampling_bench", "--model", big, "--rows", "1,8,32"],
        # sampled picks: the whole vocabulary vs its top-k first, on the real model's rows
        "sampled": ["benchmarks.sampling_bench", "--model", big, "--sampled"],
        # the generated vision pairs, model and projector on the GPU (~1 min)
        "images": ["benchmarks.image_bench", "--gpu", "--rounds", "5", "--min-idle", "0"],
    }  # fmt: skip
    for name, args in benches.items():
        found = item(run, f"serving: {name}", lambda args=args: _bench_table(run, args, tools))
        serving[name] = found
        run.results.save()


def _bench_table(run: Run, args: list[str], tools: str) -> dict[str, Any]:
    """Run one benchmark module; its markdown table (stdout) and the command."""
    timeout_s = run.budget("serving")
    if timeout_s is None:
        raise ItemFailed("out of time")
    env = {**os.environ, "HOMELAB_LLAMA_TOOLS": tools}
    command = [sys.executable, "-m", *args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env
        )
    except subprocess.TimeoutExpired:
        raise ItemFailed(f"{args[0]} timed out after {timeout_s:.0f} s") from None
    _log_stderr(args[0], done.stderr)
    if done.returncode != 0:
        raise ItemFailed(f"{args[0]} exited {done.returncode}")
    return {"command": shlex.join(["python", "-m", *args]), "table": done.stdout}


# --- section 4: the concurrency × K/V table ------------------------------------------------


def table_section(run: Run) -> None:
    config = run.config
    job = {
        "path": run.models["big"],
        "budget_bytes": config.table_budget_bytes,
        "ctx_per_request": config.table_ctx,
        "prompt_tokens": config.table_prompt_tokens,
        "gen_tokens": config.table_gen_tokens,
        "kv_types": ["f16", "q8_0", "q4_0"],
        "levels": list(config.table_levels),
        "repeats": 1,
    }
    found = item(run, "table", lambda: call_worker(run, "table", "table", job))
    run.results.data["table"] = found
    run.results.save()


SECTIONS: tuple[tuple[str, Callable[[Run], None]], ...] = (
    ("memory", memory_section),
    ("speed", speed_section),
    ("kv_speed", kv_section),
    ("table", table_section),
    ("serving", serving_section),
)


# --- entry points --------------------------------------------------------------------------


def run_all(args: argparse.Namespace) -> int:
    config = SMOKE_CONFIG if args.cpu_smoke else GPU_CONFIG
    results = Results(Path(args.out))
    deadline = args.deadline or time.time() + 3600
    run = Run(
        config, results, deadline, Path(args.models), Path(args.tools) if args.tools else None
    )
    results.data["meta"] = _meta(args, config)
    results.save()
    item(run, "prepare", lambda: prepare(run))
    if not run.models:
        log("no models: nothing else can run")
        return 1
    wanted = args.sections.split(",") if args.sections else [name for name, _ in SECTIONS]
    for name, section in SECTIONS:
        if name not in wanted:
            continue
        log(f"== {name} ({run.time_left():.0f} s left)")
        item(run, f"section {name}", lambda section=section: section(run))
    results.data["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    results.save()
    log(f"wrote {results.path}")
    return 0


def _meta(args: argparse.Namespace, config: RunConfig) -> dict[str, Any]:
    commit_file = ROOT / ".gpu" / "llama.cpp-commit.txt"
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "mode": "cpu-smoke" if config.smoke else "gpu",
        "argv": sys.argv,
        "python": sys.version,
        "llama_cpp_commit": commit_file.read_text().strip() if commit_file.exists() else None,
        "environment": {k: v for k, v in os.environ.items() if k.startswith(("CMAKE_", "HOMELAB"))},
        "config": asdict(config),
    }


def generate(args: argparse.Namespace) -> int:
    config = SMOKE_CONFIG if args.cpu_smoke else GPU_CONFIG
    started = time.perf_counter()
    paths = generate_f16(Path(args.models), config.bench_size, config.big)
    log(f"generated {paths} in {time.perf_counter() - started:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("generate", "run"))
    parser.add_argument("--models", required=True, help="folder for the generated models")
    parser.add_argument("--tools", help="folder holding llama-bench and llama-batched-bench")
    parser.add_argument("--out", default="results.json", help="results JSON (run)")
    parser.add_argument("--tools-ready", help="file that exists once the tools build has ended")
    parser.add_argument("--deadline", type=float, help="unix time by which the run must end")
    parser.add_argument(
        "--sections", help="comma-separated subset of memory,speed,kv_speed,table,serving"
    )
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny models, no GPU: check the code paths here"
    )
    args = parser.parse_args(argv)
    return generate(args) if args.command == "generate" else run_all(args)


if __name__ == "__main__":
    sys.exit(main())
