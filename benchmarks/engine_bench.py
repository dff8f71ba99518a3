"""Side-by-side decode speed: homelab's engine against llama.cpp's own tools and ``Llama``.

Every contender runs the same model file with the same thread count and flash-attention
setting, in the same run, interleaved round by round (A B C A B C …) so that noise from a
shared machine hits all of them alike; each figure is the best and the median of the rounds.
Each measurement runs in a fresh process: ggml's CPU backend uses OpenMP, and once two
threads of one process have run parallel regions libgomp counts more threads than CPUs and
stops spinning between regions, which costs 15-20% at 2 threads — the contenders must not
slow each other down that way.

Measured:

- single stream decode tok/s: ``llama-bench`` tg128, llama-cpp-python's ``Llama`` streaming
  128 tokens, and the engine streaming 128 tokens (one slot), each with the same sampling;
- aggregate decode tok/s with N concurrent streams: ``llama-batched-bench`` (N parallel
  sequences, 32-token prompts, 128 generated) against the engine with N slots and N requests;
- TTFT of a 2,000-token prompt, cold and when the same tenant sends the same prefix again.

This is a harness, not a test: nothing here asserts; the ratios are printed and saved.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.llama_tools import HERE, tool_path
from homelab.engine.api import FinishEvent, GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.settings import Settings

N_GEN = 128
PROMPT_TOKENS = 32
SAMPLING_DEFAULT = SamplingParams(seed=1234, max_tokens=N_GEN, ignore_eos=True)
SAMPLING_GREEDY = SamplingParams(temperature=0.0, max_tokens=N_GEN, ignore_eos=True)


@dataclass
class Series:
    """Repeated measurements of one quantity (higher is better unless noted)."""

    name: str
    unit: str
    values: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return max(self.values) if self.values else float("nan")

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")


@dataclass(frozen=True)
class BenchConfig:
    model: Path
    threads: int = 2
    flash_attn: bool = False
    rounds: int = 3
    streams: tuple[int, ...] = (8, 16)
    ttft_prefix_tokens: int = 2000
    min_idle: float = 0.8  # wait for this share of idle CPU before each measurement
    max_wait_s: float = 60.0


# --- llama.cpp's tools ---------------------------------------------------------------------


def _run_json_lines(command: list[str]) -> list[dict[str, Any]]:
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    text = result.stdout.strip()
    if text.startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def llama_bench_tg(config: BenchConfig) -> float:
    command = [
        str(tool_path("llama-bench")), "-m", str(config.model), "-p", "0", "-n", str(N_GEN),
        "-t", str(config.threads), "-fa", "1" if config.flash_attn else "0", "-r", "1",
        "-o", "json",
    ]  # fmt: skip
    return float(_run_json_lines(command)[0]["avg_ts"])


def batched_bench_tg(config: BenchConfig, streams: int) -> float:
    command = [
        str(tool_path("llama-batched-bench")), "-m", str(config.model),
        "-c", str(_ctx_per_slot() * streams), "-npp", str(PROMPT_TOKENS), "-ntg", str(N_GEN),
        "-npl", str(streams), "-t", str(config.threads),
        "-fa", "on" if config.flash_attn else "off", "-no-kvu", "--output-format", "jsonl",
    ]  # fmt: skip
    return float(_run_json_lines(command)[-1]["speed_tg"])


# --- llama-cpp-python's Llama ----------------------------------------------------------------


def llama_python_stream(config: BenchConfig, sampling: SamplingParams) -> float:
    from llama_cpp import Llama

    llm = Llama(
        str(config.model),
        n_threads=config.threads,
        n_ctx=_ctx_per_slot(),
        flash_attn=config.flash_attn,
        verbose=False,
    )
    try:
        times = []
        stream = llm.create_completion(
            "hello world",
            max_tokens=N_GEN,
            stream=True,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            seed=sampling.seed,
        )
        for _chunk in stream:
            times.append(time.perf_counter())
        return (len(times) - 1) / (times[-1] - times[0])
    finally:
        llm.close()


# --- the engine ------------------------------------------------------------------------------


def _ctx_per_slot() -> int:
    return 256  # 32 prompt + 128 generated fits; padded like llama.cpp pads


def _settings(config: BenchConfig, slots: int, ctx_per_slot: int) -> Settings:
    return Settings(
        n_ctx=ctx_per_slot * slots,
        n_ctx_per_slot=ctx_per_slot,
        n_parallel=slots,
        flash_attn=config.flash_attn,
        n_threads=config.threads,
    )


def _load(config: BenchConfig, slots: int, ctx_per_slot: int | None = None) -> Engine:
    settings = _settings(config, slots, ctx_per_slot or _ctx_per_slot())
    return Engine.load(config.model, settings, record_calibration=False)


def _prompt(seed: int) -> tuple[int, ...]:
    """PROMPT_TOKENS ordinary token ids, different per stream (no shared prefix)."""
    return tuple(300 + (seed * 97 + i * 31) % 20000 for i in range(PROMPT_TOKENS))


def engine_single_stream(config: BenchConfig, sampling: SamplingParams) -> float:
    with _load(config, 1) as engine:
        times = []
        handle = engine.submit(GenerationRequest("bench", "hello world", sampling))
        for event in handle:
            if not isinstance(event, FinishEvent):
                times.append(time.perf_counter())
        return (len(times) - 1) / (times[-1] - times[0])


def engine_aggregate(config: BenchConfig, streams: int) -> float:
    """Decode tokens per second while all ``streams`` requests generate together."""
    with _load(config, streams) as engine:
        started = time.perf_counter()
        handles = [
            engine.submit(GenerationRequest(f"t{i}", _prompt(i), SAMPLING_DEFAULT))
            for i in range(streams)
        ]
        finishes = [handle.collect().finish for handle in handles]
        ended = time.perf_counter()
    first_tokens = max(started + f.stats.ttft_s for f in finishes)
    decoded = sum(f.stats.completion_tokens - 1 for f in finishes)
    return decoded / (ended - first_tokens)


def engine_ttft(config: BenchConfig, round_index: int) -> tuple[float, float]:
    """(cold TTFT, same-tenant prefix-hit TTFT) for a ``ttft_prefix_tokens`` prompt."""
    prefix = tuple(300 + (i * 37) % 20000 for i in range(config.ttft_prefix_tokens))
    tail_a = tuple(range(1000, 1016))
    tail_b = tuple(range(2000, 2016))
    one_token = SamplingParams(temperature=0.0, max_tokens=1)
    with _load(config, 1, ctx_per_slot=4096) as engine:
        tenant = f"tenant-{round_index}"
        cold = engine.submit(GenerationRequest(tenant, prefix + tail_a, one_token)).collect()
        hit = engine.submit(GenerationRequest(tenant, prefix + tail_b, one_token)).collect()
    assert hit.finish.stats.cached_tokens == config.ttft_prefix_tokens
    return cold.finish.stats.ttft_s, hit.finish.stats.ttft_s


# --- one measurement per process -------------------------------------------------------------

WORKERS: dict[str, Callable[..., Any]] = {
    "engine stream default": lambda c: engine_single_stream(c, SAMPLING_DEFAULT),
    "engine stream greedy": lambda c: engine_single_stream(c, SAMPLING_GREEDY),
    "Llama stream default": lambda c: llama_python_stream(c, SAMPLING_DEFAULT),
    "Llama stream greedy": lambda c: llama_python_stream(c, SAMPLING_GREEDY),
    "engine aggregate": engine_aggregate,
    "engine ttft": engine_ttft,
}


def isolated(name: str, config: BenchConfig, *args: Any) -> Any:
    """Run ``WORKERS[name](config, *args)`` in a fresh Python process; return its result."""
    payload = {"name": name, "config": {**config.__dict__, "model": str(config.model)}}
    payload["args"] = list(args)
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_bench", json.dumps(payload)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"benchmark worker {name!r} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _worker_main(payload_text: str) -> None:
    payload = json.loads(payload_text)
    config_fields = payload["config"]
    config_fields["model"] = Path(config_fields["model"])
    config_fields["streams"] = tuple(config_fields["streams"])
    value = WORKERS[payload["name"]](BenchConfig(**config_fields), *payload["args"])
    print(json.dumps(value))


# --- a shared machine --------------------------------------------------------------------------


def _cpu_times() -> tuple[float, float]:
    with open("/proc/stat") as stat:
        fields = [float(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return idle, sum(fields)


def idle_fraction(window_s: float = 1.0) -> float:
    """Share of all CPUs idle over ``window_s`` (1.0 = nobody else is running)."""
    idle_a, total_a = _cpu_times()
    time.sleep(window_s)
    idle_b, total_b = _cpu_times()
    return (idle_b - idle_a) / max(total_b - total_a, 1e-9)


def wait_for_quiet(min_idle: float, max_wait_s: float, log: Callable[[str], None]) -> float:
    """Wait until other processes leave the CPUs mostly idle (llama.cpp's spinning threads
    collapse when a core is taken away mid-step); give up after ``max_wait_s``."""
    deadline = time.monotonic() + max_wait_s
    idle = idle_fraction()
    while idle < min_idle and time.monotonic() < deadline:
        log(f"  (machine busy: {idle:.0%} idle, waiting)")
        time.sleep(2.0)
        idle = idle_fraction()
    return idle


# --- the run ---------------------------------------------------------------------------------


Measurement = tuple[str, str, Callable[[], float]]  # name, unit, how to take one value


def _round(config: BenchConfig, round_index: int) -> list[Measurement]:
    ttft: dict[str, float] = {}

    def ttft_cold() -> float:
        ttft["cold"], ttft["hit"] = isolated("engine ttft", config, round_index)
        return ttft["cold"]

    prefix = config.ttft_prefix_tokens
    plan: list[Measurement] = [
        ("llama-bench tg128", "tok/s", partial(llama_bench_tg, config)),
        ("engine stream (default sampling)", "tok/s",
         partial(isolated, "engine stream default", config)),
        ("Llama stream (default sampling)", "tok/s",
         partial(isolated, "Llama stream default", config)),
        ("engine stream (greedy)", "tok/s", partial(isolated, "engine stream greedy", config)),
        ("Llama stream (greedy)", "tok/s", partial(isolated, "Llama stream greedy", config)),
    ]  # fmt: skip
    for streams in config.streams:
        plan.append(
            (
                f"llama-batched-bench {streams} seqs",
                "tok/s",
                partial(batched_bench_tg, config, streams),
            )
        )
        plan.append(
            (f"engine {streams} streams", "tok/s",
             partial(isolated, "engine aggregate", config, streams))
        )  # fmt: skip
    plan.append((f"TTFT {prefix}-token prompt, cold", "s", ttft_cold))
    plan.append((f"TTFT {prefix}-token prompt, prefix hit", "s", lambda: ttft["hit"]))
    return plan


def measure(config: BenchConfig, log: Callable[[str], None] = print) -> dict[str, Series]:
    series: dict[str, Series] = {}
    for round_index in range(config.rounds):
        log(f"round {round_index + 1}/{config.rounds}")
        for name, unit, take in _round(config, round_index):
            idle = wait_for_quiet(config.min_idle, config.max_wait_s, log)
            value = take()
            series.setdefault(name, Series(name, unit)).values.append(value)
            log(f"  {name:<40} {value:9.3f} {unit}   (CPUs {idle:.0%} idle before)")
    return series


@dataclass(frozen=True)
class Ratio:
    label: str
    value: float
    target: float

    @property
    def met(self) -> bool:
        return self.value >= self.target


def ratios(series: dict[str, Series], config: BenchConfig) -> list[Ratio]:
    def best(name: str) -> float:
        return series[name].best

    def fastest(name: str) -> float:  # for times, lower is better
        return min(series[name].values)

    found = [
        Ratio("engine / llama-bench tg128 (single stream)",
              best("engine stream (default sampling)") / best("llama-bench tg128"), 0.9),
        Ratio("engine / Llama streaming (default sampling)",
              best("engine stream (default sampling)")
              / best("Llama stream (default sampling)"), 1.3),
        Ratio("engine / Llama streaming (greedy)",
              best("engine stream (greedy)") / best("Llama stream (greedy)"), 1.0),
    ]  # fmt: skip
    for streams in config.streams:
        found.append(
            Ratio(
                f"engine / llama-batched-bench, {streams} streams",
                best(f"engine {streams} streams") / best(f"llama-batched-bench {streams} seqs"),
                0.9,
            )
        )
    if len(config.streams) >= 2:
        low, high = config.streams[0], config.streams[-1]
        found.append(
            Ratio(f"engine {high} streams / {low} streams",
                  best(f"engine {high} streams") / best(f"engine {low} streams"), 1.0)
        )  # fmt: skip
    prefix = config.ttft_prefix_tokens
    found.append(
        Ratio(f"TTFT cold / prefix hit ({prefix} tokens)",
              fastest(f"TTFT {prefix}-token prompt, cold")
              / fastest(f"TTFT {prefix}-token prompt, prefix hit"), 5.0)
    )  # fmt: skip
    return found


def markdown(series: dict[str, Series], found: list[Ratio]) -> str:
    lines = ["| measurement | best | median | unit | rounds |", "|---|---:|---:|---|---:|"]
    for item in series.values():
        best = min(item.values) if item.unit == "s" else item.best
        lines.append(
            f"| {item.name} | {best:.3f} | {item.median:.3f} | {item.unit} | {len(item.values)} |"
        )
    lines += ["", "| ratio | measured | target | met |", "|---|---:|---:|---|"]
    for ratio in found:
        lines.append(
            f"| {ratio.label} | {ratio.value:.2f}x | ≥ {ratio.target:.1f}x | "
            f"{'yes' if ratio.met else 'NO'} |"
        )
    return "\n".join(lines)


def save(series: dict[str, Series], found: list[Ratio], config: BenchConfig, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"engine-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document = {
        "config": {**config.__dict__, "model": str(config.model)},
        "series": {name: item.values for name, item in series.items()},
        "ratios": [ratio.__dict__ for ratio in found],
    }
    path.write_text(json.dumps(document, indent=2))
    return path


if __name__ == "__main__":
    _worker_main(sys.argv[1])
