"""``python -m benchmarks.step_bench``: homelab's own per-step cost, where a GPU would expose it.

    python -m benchmarks.step_bench                       # tiny F16 demo, 5 rounds
    python -m benchmarks.step_bench --rounds 7 --ttft     # and TTFT of 2K/8K/32K prompts
    python -m benchmarks.step_bench --ttft-only --ttft-prompts 32768 --rounds 1

The tiny demo model decodes in ~0.3 ms a step on this CPU — a stand-in for a GPU's step time
(an 8B model on an RTX 4090: ~6 ms; a 1-4B model: 1-5 ms), where a few hundred microseconds of
Python per token are no longer hidden by the compute. Steady state, side by side:

- **single stream**: the engine (one process, kept running, one slot) streaming ``--tokens``
  greedy tokens with end-of-text banned, against ``llama-bench -n --tokens`` (tg). Read as
  ``homelab run`` reads it (``RequestHandle.chunks``: what has come, every 20 ms) and, in a
  row of its own, by a reader woken for every token (llama-bench has no reader at all). Two
  floors run beside it, kept running too: a bare llama-cpp-python loop (``bare_loop.py``)
  and the same loop in C over the very libllama the engine loads (``c_loop.c``, built with
  ``cc`` on first use), which tells the library's build from Python and from homelab;
- **batched**: the engine with S slots (one process per S, kept running) generating 128
  tokens in each of S sequences at once, against ``llama-batched-bench -npl S`` (S_TG);
- **TTFT** (``--ttft``): ``homelab serve`` and ``llama-server`` (the same planned context,
  batch and ubatch sizes, one slot each, kept running) answering one-token completions of new
  2K / 8K / 32K-token prompts on the bench demo model: prefill is where a GPU spends its
  compute.

Every round runs each contender once, the order flipped every other round, each after the
CPUs are mostly idle. Reported: the median and the worst of the rounds after the first, and
the first. The server comparisons at 1/8/16 clients are ``benchmarks.server_bench --model``
with the same tiny file. A harness, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

import httpx

from benchmarks.decode_gaps import between_decodes_us, time_decodes
from benchmarks.engine_bench import wait_for_quiet
from benchmarks.llama_tools import HERE, build_c_loop, build_tools, tool_path
from benchmarks.server_bench import (
    ServerBenchConfig,
    free_port,
    llama_server_command,
    ours_command,
    planned_settings,
    running,
)

BATCH_TOKENS = 128
BATCH_PROMPT_TOKENS = 32
TTFT_PROMPTS = (2048, 8192, 32768)
OURS, THEIRS = "homelab", "llama.cpp"
PER_TOKEN = "homelab, reader woken per token"
BARE = "bare llama-cpp-python loop"  # no homelab: the floor of a Python engine (bare_loop)
C_LOOP = "C loop over the same libllama"  # no Python: the floor of any engine (c_loop.c)
BETWEEN = ": µs between decodes"  # homelab's own time per step (benchmarks.decode_gaps)


@dataclass(frozen=True)
class StepBenchConfig:
    model: Path
    threads: int = 2
    rounds: int = 5
    tokens: int = 512
    streams: tuple[int, ...] = (8, 16, 32)
    ttft: bool = False
    ttft_only: bool = False  # skip the single-stream and batched rows (the GPU script has them)
    ttft_model: Path | None = None
    ttft_prompts: tuple[int, ...] = TTFT_PROMPTS  # prompt tokens
    min_idle: float = 0.8
    max_wait_s: float = 20.0


@dataclass
class Series:
    values: list[float] = field(default_factory=list)

    @property
    def later(self) -> list[float]:
        """The rounds after the first (NaN where a tool printed nothing: see ``measure``)."""
        return self.values[1:] or self.values

    @property
    def measured(self) -> list[float]:
        return [value for value in self.later if not math.isnan(value)]

    @property
    def median(self) -> float:
        return statistics.median(self.measured) if self.measured else float("nan")

    def worst(self, lower_better: bool = False) -> float:
        if not self.measured:
            return float("nan")
        return max(self.measured) if lower_better else min(self.measured)


Results = dict[tuple[str, str], Series]  # (row, contender) -> values


# --- the engine, kept running in its own process --------------------------------------------


def serve_engine(model: str, slots: int, threads: int, ctx_per_slot: int) -> None:
    """Child process: load the engine once, then answer one JSON command per stdin line."""
    from homelab.engine.api import GenerationRequest, SamplingParams
    from homelab.engine.engine import Engine
    from homelab.settings import Settings

    settings = Settings(
        n_ctx=ctx_per_slot * slots,
        n_ctx_per_slot=ctx_per_slot,
        n_parallel=slots,
        n_threads=threads,
        flash_attn=False,
    )
    engine = Engine.load(model, settings, record_calibration=False)
    decodes = time_decodes()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        sampling = SamplingParams(temperature=0.0, max_tokens=command["tokens"], ignore_eos=True)
        decodes.clear()
        if command["op"] == "stream":
            handle = engine.submit(GenerationRequest("bench", "hello world", sampling))
            value = _stream_tok_s(handle, per_token=command.get("per_token", False))
        else:
            value = _aggregate(engine, command["streams"], sampling, command["round"])
        between_us = between_decodes_us(decodes)
        print(json.dumps({"value": value, "between_us": between_us}), flush=True)
    engine.close()


def _stream_tok_s(handle: Any, *, per_token: bool) -> float:
    """Decode tok/s of one stream: read as ``homelab run`` reads it (``chunks``: the reader
    takes what has come every 20 ms), or by a reader woken for every token."""
    from homelab.engine.api import FinishEvent

    if not per_token:
        finish = [e for events in handle.chunks() for e in events if isinstance(e, FinishEvent)]
        return float(finish[0].stats.decode_tok_s)  # first token -> last, timed on the lane
    times = [time.perf_counter() for event in handle if not isinstance(event, FinishEvent)]
    return (len(times) - 1) / (times[-1] - times[0])


def _aggregate(engine: Any, streams: int, sampling: Any, round_index: int) -> float:
    """Decode tok/s while all ``streams`` sequences generate (prefill excluded, as S_TG)."""
    from homelab.engine.api import GenerationRequest

    prompts = [
        tuple(300 + (round_index * 131 + s * 97 + i * 31) % 700 for i in range(BATCH_PROMPT_TOKENS))
        for s in range(streams)
    ]
    started = time.perf_counter()
    handles = [
        engine.submit(GenerationRequest(f"t{s}", p, sampling)) for s, p in enumerate(prompts)
    ]
    finishes = [handle.collect().finish for handle in handles]
    ended = time.perf_counter()
    decoding_from = max(started + f.stats.ttft_s for f in finishes)
    decoded = sum(f.stats.completion_tokens - 1 for f in finishes)
    return decoded / (ended - decoding_from)


class EngineProcess:
    """A contender kept running in its own process: the engine (``serve_engine``); with
    ``loop="bare"`` a bare llama-cpp-python loop (``benchmarks.bare_loop``, one slot); with
    ``loop="c"`` the same loop in C over the same libllama (``benchmarks/c_loop.c``)."""

    def __init__(
        self, config: StepBenchConfig, slots: int, ctx_per_slot: int, *, loop: str = ""
    ) -> None:
        model_threads = [str(config.model), str(config.threads)]
        if loop == "c":
            command = [str(build_c_loop()), *model_threads, str(ctx_per_slot)]
        elif loop == "bare":
            command = [sys.executable, "-m", "benchmarks.bare_loop", *model_threads]
            command.append(str(ctx_per_slot))
        else:
            arguments = [str(config.model), str(slots), str(config.threads), str(ctx_per_slot)]
            command = [sys.executable, "-m", "benchmarks.step_bench", "--serve-engine"]
            command += arguments
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read()  # {"ready": true}
        self.between_us: list[float] = []  # per command: homelab's own µs per step

    def ask(self, **command: Any) -> float:
        """The command's tok/s; its median µs between decodes goes to ``between_us``."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        self.between_us.append(float(answer["between_us"]))
        return float(answer["value"])

    def _read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError("the engine process ended early")
        return dict(json.loads(line))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


# --- llama.cpp's tools --------------------------------------------------------------------------


def _json_lines(command: list[str], tries: int = 10) -> list[dict[str, Any]]:
    """The tool's JSON records (llama-batched-bench sometimes exits 0 having printed
    nothing at all, about one run in six here: such a run is retried, up to ``tries``
    times)."""
    for _ in range(tries):
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        text = result.stdout.strip()
        if text.startswith("["):
            return list(json.loads(text))
        records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        if records:
            return records
    raise RuntimeError(f"{command[0]} printed no results: {result.stderr[-800:]}")


def llama_bench_tg(config: StepBenchConfig) -> float:
    command = [
        str(tool_path("llama-bench")), "-m", str(config.model), "-p", "0",
        "-n", str(config.tokens), "-t", str(config.threads), "-fa", "0", "-r", "1", "-o", "json",
    ]  # fmt: skip
    return float(_json_lines(command)[0]["avg_ts"])


def batched_bench_tg(config: StepBenchConfig, streams: int, ctx_per_slot: int) -> float:
    command = [
        str(tool_path("llama-batched-bench")), "-m", str(config.model),
        "-c", str(ctx_per_slot * streams), "-npp", str(BATCH_PROMPT_TOKENS),
        "-ntg", str(BATCH_TOKENS), "-npl", str(streams), "-t", str(config.threads),
        "-fa", "off", "-no-kvu", "--output-format", "jsonl",
    ]  # fmt: skip
    return float(_json_lines(command)[-1]["speed_tg"])


# --- TTFT against llama-server ------------------------------------------------------------------


def ttft_prompt(n_tokens: int, round_index: int) -> list[int]:
    """A new prompt of ordinary token ids each round (nothing for a prefix cache to reuse)."""
    rng = random.Random(round_index * 1_000_003 + n_tokens)
    return [rng.randrange(300, 1000) for _ in range(n_tokens)]  # within every demo vocabulary


def one_token_s(client: httpx.Client, url: str, prompt: list[int]) -> float:
    body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    response = client.post(url + "/v1/completions", json=body, timeout=900)
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:500]}")
    return time.perf_counter() - started


@contextmanager
def ttft_servers(config: StepBenchConfig) -> Iterator[dict[str, str]]:
    model = config.ttft_model or _bench_model()
    ctx = max(config.ttft_prompts) + 256
    server_config = ServerBenchConfig(model=model, threads=config.threads, ctx_per_slot=ctx)
    settings = planned_settings(server_config, 1)
    ours_port, theirs_port = free_port(), free_port()
    with ExitStack() as stack:
        ours = stack.enter_context(running(ours_command(server_config, 1, ours_port), ours_port))
        theirs_command = [*llama_server_command(server_config, settings, theirs_port)]
        theirs_command += _trained_context_at_least(model, ctx)
        theirs = stack.enter_context(running(theirs_command, theirs_port))
        yield {OURS: ours.url, THEIRS: theirs.url}


def _trained_context_at_least(model: Path, ctx: int) -> list[str]:
    """llama-server caps the context at the model's trained length (homelab serve does not):
    raise the file's own ``context_length`` for it, so that both serve the same context."""
    from homelab.gguf.reader import read_model

    info = read_model(model)
    if info.context_length >= ctx:
        return []
    return ["--override-kv", f"{info.architecture}.context_length=int:{ctx}"]


def _bench_model() -> Path:
    from homelab.gguf.demo import demo_ref_path

    return demo_ref_path("demo:bench:Q8_0")


# --- the run ------------------------------------------------------------------------------------


def measure(config: StepBenchConfig, log: Callable[[str], None]) -> Results:
    build_tools()
    results: Results = {}
    ctx_single = config.tokens + 64
    with ExitStack() as stack:
        single = None if config.ttft_only else EngineProcess(config, 1, ctx_single)
        floors = {} if config.ttft_only else {
            BARE: EngineProcess(config, 1, ctx_single, loop="bare"),
            C_LOOP: EngineProcess(config, 1, ctx_single, loop="c"),
        }  # fmt: skip
        for process in (single, *floors.values()):
            if process is not None:
                stack.callback(process.close)
        streams = () if config.ttft_only else config.streams
        batched = {s: EngineProcess(config, s, 256) for s in streams}
        for process in batched.values():
            stack.callback(process.close)
        urls = stack.enter_context(ttft_servers(config)) if config.ttft else {}
        client = stack.enter_context(httpx.Client())
        for round_index in range(config.rounds):
            flip = round_index % 2 == 1
            rows: list[tuple[str, dict[str, Callable[[], float]]]] = []
            engines: dict[str, EngineProcess] = {}  # row -> the engine process measured
            if single is not None:
                engines[f"single stream tg{config.tokens}"] = single
                tokens = config.tokens
                stream: dict[str, Callable[[], float]] = {
                    OURS: partial(single.ask, op="stream", tokens=tokens),
                    PER_TOKEN: partial(single.ask, op="stream", tokens=tokens, per_token=True),
                }
                for name, floor in floors.items():
                    stream[name] = partial(floor.ask, op="stream", tokens=tokens)
                stream[THEIRS] = lambda: llama_bench_tg(config)
                rows.append((f"single stream tg{config.tokens}", stream))
            for s in streams:
                engines[f"{s} sequences S_TG"] = batched[s]
                rows.append(
                    (
                        f"{s} sequences S_TG",
                        {
                            OURS: lambda s=s, r=round_index: batched[s].ask(  # type: ignore[misc]
                                op="batch", streams=s, tokens=BATCH_TOKENS, round=r
                            ),
                            THEIRS: lambda s=s: batched_bench_tg(config, s, 256),  # type: ignore[misc]
                        },
                    )
                )
            for n in config.ttft_prompts if config.ttft else ():
                prompt = ttft_prompt(n, round_index)
                rows.append(
                    (
                        f"TTFT {n // 1024}K prompt (s, lower is better)",
                        {
                            name: lambda u=url, p=prompt: one_token_s(client, u, p)  # type: ignore[misc]
                            for name, url in urls.items()
                        },
                    )
                )
            for row, contenders in rows:
                order = list(contenders.items())
                for name, run in reversed(order) if flip else order:
                    wait_for_quiet(config.min_idle, config.max_wait_s, log)
                    try:
                        value = run()
                    except RuntimeError as exc:  # llama-batched-bench at times prints nothing
                        log(f"round {round_index + 1} {row} {name}: no result ({exc})")
                        value = math.nan
                    results.setdefault((row, name), Series()).values.append(value)
                    log(f"round {round_index + 1} {row:<40} {name:<10} {value:10.3f}")
                    process = floors.get(name) or engines.get(row)
                    if name in (OURS, PER_TOKEN, BARE, C_LOOP) and process is not None:
                        between = process.between_us[-1]
                        results.setdefault((row, name + BETWEEN), Series()).values.append(between)
    return results


def markdown(config: StepBenchConfig, results: Results) -> str:
    rows = sorted({row for row, _ in results}, key=_row_order)
    lines = [
        f"model {config.model.name} (TTFT: {(config.ttft_model or _bench_model()).name}), "
        f"{config.threads} threads, {config.rounds} rounds "
        "(median and worst of the rounds after the first; first round in brackets)",
        "",
        f"| | {OURS} median · worst | {THEIRS} median · worst | ratio of medians · worst "
        "round | ratio per round, median |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        theirs = results[(row, THEIRS)]
        lower_better = "lower is better" in row
        labels = (
            (OURS, row),
            (PER_TOKEN, f"{row}, reader woken per token"),
            (BARE, f"{row}, {BARE} (no homelab)"),
            (C_LOOP, f"{row}, {C_LOOP} (no Python)"),
        )
        for name, label in labels:
            ours = results.get((row, name))
            if ours is None:
                continue
            ratio = theirs.median / ours.median if lower_better else ours.median / theirs.median
            per_round = _round_ratios(ours, theirs, lower_better)
            worst = min(per_round) if per_round else float("nan")
            paired = statistics.median(per_round) if per_round else float("nan")
            lines.append(
                f"| {label} | {ours.median:.3f} · {ours.worst(lower_better):.3f} "
                f"[{ours.values[0]:.3f}] | {theirs.median:.3f} · "
                f"{theirs.worst(lower_better):.3f} [{theirs.values[0]:.3f}] | "
                f"{ratio:.2f}x · {worst:.2f}x | {paired:.2f}x |"
            )
    single = next((row for row in rows if (row, BARE) in results), None)
    if single is not None:
        lines.append("")
        for floor, what in ((BARE, "calling llama.cpp from Python"), (C_LOOP, "the library")):
            per_round = _round_ratios(results[(single, OURS)], results[(single, floor)], False)
            lines.append(
                f"{single}: homelab / {floor} per round, median "
                f"{statistics.median(per_round):.2f}x (worst {min(per_round):.2f}x): what "
                f"homelab adds to {what}"
            )
    return "\n".join(lines)


def between_decodes_table(results: Results) -> str:
    """homelab's own time per step (median of each round's median gap between decodes) and
    its share of the step, per row."""
    lines = [
        "homelab's own time per step: the gap between one llama_decode's return and the next "
        "one's start, median of the later rounds (worst round)",
        "",
        "| | µs between decodes | share of the step |",
        "|---|---:|---:|",
    ]
    for row, name in sorted(
        (key for key in results if key[1].endswith(BETWEEN)), key=lambda k: _row_order(k[0])
    ):
        between = results[(row, name)]
        speed = results[(row, name.removesuffix(BETWEEN))]
        sequences = 1 if row.startswith("single") else int(row.split()[0])
        step_us = 1e6 * sequences / speed.median
        contender = name.removesuffix(BETWEEN)
        labels = {PER_TOKEN: f"{row}, reader woken per token", BARE: f"{row}, {BARE}"}
        label = {**labels, C_LOOP: f"{row}, {C_LOOP}"}.get(contender, row)
        lines.append(
            f"| {label} | {between.median:.1f} ({between.worst(lower_better=True):.1f}) | "
            f"{between.median / step_us:.1%} |"
        )
    return "\n".join(lines)


def _round_ratios(ours: Series, theirs: Series, lower_better: bool) -> list[float]:
    """Ours over theirs in each later round (measured minutes apart on a machine whose speed
    drifts by up to 2x over minutes, the pairs of one round are the fair comparison)."""
    pairs = zip(ours.later, theirs.later, strict=False)
    measured = [(o, t) for o, t in pairs if not (math.isnan(o) or math.isnan(t))]
    return [(t / o) if lower_better else (o / t) for o, t in measured]


def _row_order(row: str) -> tuple[int, int]:
    digits = "".join(c for c in row.split()[1 if row.startswith("TTFT") else 0] if c.isdigit())
    kind = 0 if row.startswith("single") else 2 if row.startswith("TTFT") else 1
    return kind, int(digits or 0)


def save(config: StepBenchConfig, results: Results, table: str) -> Path:
    out = HERE / "out" / f"step_bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": {
            **config.__dict__,
            "model": str(config.model),
            "ttft_model": str(config.ttft_model),
        },
        "results": {f"{row} | {name}": series.values for (row, name), series in results.items()},
        "table": table,
    }
    out.write_text(json.dumps(payload, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-engine"]:
        model, slots, threads, ctx = argv[1:5]
        serve_engine(model, int(slots), int(threads), int(ctx))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="GGUF (default: demo:llama:tiny:F16)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=512, help="single-stream tokens (512)")
    parser.add_argument("--streams", default="8,16,32", help="batched sequences (8,16,32)")
    parser.add_argument("--ttft", action="store_true", help="also TTFT of 2K/8K/32K prompts")
    parser.add_argument("--ttft-only", action="store_true", help="only the TTFT rows")
    parser.add_argument(
        "--ttft-prompts", default="2048,8192,32768", help="TTFT prompt tokens (2048,8192,32768)"
    )
    parser.add_argument("--ttft-model", type=Path, help="GGUF for TTFT (default: demo:bench:Q8_0)")
    parser.add_argument("--min-idle", type=float, default=0.8)
    args = parser.parse_args(argv)
    from homelab.gguf.demo import demo_ref_path

    config = StepBenchConfig(
        model=args.model or demo_ref_path("demo:llama:tiny:F16"),
        threads=args.threads,
        rounds=args.rounds,
        tokens=args.tokens,
        streams=tuple(int(s) for s in args.streams.split(",") if s),
        ttft=args.ttft or args.ttft_only,
        ttft_only=args.ttft_only,
        ttft_model=args.ttft_model,
        ttft_prompts=tuple(int(n) for n in args.ttft_prompts.split(",") if n),
        min_idle=args.min_idle,
    )
    results = measure(config, lambda line: print(line, file=sys.stderr, flush=True))
    table = markdown(config, results) + "\n\n" + between_decodes_table(results)
    print(table)
    print(f"saved {save(config, results, table)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
