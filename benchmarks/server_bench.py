"""``python -m benchmarks.server_bench``: ``homelab serve`` vs ``llama-server -np N`` over HTTP.

    python -m benchmarks.server_bench                       # bench demo (Q8_0), 2 threads, 3 rounds
    python -m benchmarks.server_bench --concurrency 1,8,16 --rounds 3 --threads 2

Both servers load the same model with the same llama.cpp settings: the ones ``homelab serve``
plans (``--ctx``, ``--parallel N``, ``--goal throughput``), passed to ``llama-server`` as flags
(``-c``, ``-np``, ``-fa``, ``-b``, ``-ub``, cache types, unified KV or not). For each
concurrency N, each server is started with N slots, warmed up, and N HTTP clients send one
streaming ``/v1/completions`` request each at the same moment (distinct prompts, the same
sampling, end-of-text banned so every answer is ``--max-tokens`` long). Servers alternate
round by round so a busy shared machine hurts both alike.

Reported: aggregate completion tok/s (all tokens / wall time from the first request sent to
the last token received), and TTFT p50/p95 over every request of every round. The figure
compared is the best round's tok/s; the target is ours ≥ 0.9x theirs at every concurrency.
This is a harness, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.engine_bench import wait_for_quiet
from benchmarks.llama_tools import HERE, build_tools, tool_path
from homelab.settings import Settings

BANNED_END_TOKENS = {"2": -100, "4": -100}  # </s> and <|im_end|> of the demo vocabulary
WORDS = ("cache", "token", "layer", "model", "speed", "memory", "context", "quant", "slot", "batch")
STARTUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ServerBenchConfig:
    model: Path
    threads: int = 2
    rounds: int = 3
    concurrency: tuple[int, ...] = (1, 8, 16)
    max_tokens: int = 128
    ctx_per_slot: int = 512
    temperature: float = 0.8  # llama.cpp's default sampling (0: greedy)
    min_idle: float = 0.8
    max_wait_s: float = 60.0


@dataclass
class Measurement:
    """One server at one concurrency, over the rounds."""

    tok_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)  # every request of every round

    @property
    def best_tok_s(self) -> float:
        return max(self.tok_s) if self.tok_s else float("nan")

    def ttft_percentile(self, fraction: float) -> float:
        if not self.ttft_s:
            return float("nan")
        ordered = sorted(self.ttft_s)
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


# --- the two servers --------------------------------------------------------------------------


def planned_settings(config: ServerBenchConfig, slots: int) -> Settings:
    """What ``homelab serve`` will load: its own planner, with the flags the bench passes."""
    from dataclasses import replace

    from homelab.cli import flags as cli_flags
    from homelab.models.launch import plan_file
    from homelab.models.ref import resolve

    parser = argparse.ArgumentParser()
    cli_flags.add_plan_flags(parser)
    flags = ["--ctx", str(config.ctx_per_slot), "--parallel", str(slots), "--goal", "throughput"]
    args = parser.parse_args(flags)
    ref = resolve(str(config.model))
    plan = plan_file(ref, cli_flags.plan_request(args), cli_flags.hardware(args))
    return replace(plan.settings, n_threads=config.threads)


def ours_command(config: ServerBenchConfig, slots: int, port: int) -> list[str]:
    return [
        sys.executable, "-m", "homelab.cli", "serve", str(config.model), "--port", str(port),
        "--model-id", "bench", "--ctx", str(config.ctx_per_slot), "--parallel", str(slots),
        "--goal", "throughput", "--threads", str(config.threads),
    ]  # fmt: skip


def llama_server_command(config: ServerBenchConfig, settings: Settings, port: int) -> list[str]:
    return [
        str(tool_path("llama-server")), "-m", str(config.model), "--host", "127.0.0.1",
        "--port", str(port), "-c", str(settings.n_ctx), "-np", str(settings.n_parallel),
        "-t", str(config.threads), "-fa", "on" if settings.flash_attn else "off",
        "-b", str(settings.n_batch), "-ub", str(settings.n_ubatch),
        "-ctk", settings.type_k, "-ctv", settings.type_v,
        "-kvu" if settings.kv_unified else "-no-kvu",
        "-cram", "0", "--no-webui", "--log-disable",
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running(command: list[str], port: int) -> Iterator[str]:
    """Start a server process, wait for ``/health`` 200, yield its base URL, stop it."""
    env = {**os.environ, "HOMELAB_HOME": os.environ.get("HOMELAB_HOME", str(HERE / "out" / "home"))}
    log_path = HERE / "out" / "logs" / f"{Path(command[0]).name}-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(process, url, log_path)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _healthy(url):
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the server exited early (log {log_path}):\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not become healthy (log {log_path})")
        time.sleep(0.1)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# --- the clients ------------------------------------------------------------------------------


def request_body(config: ServerBenchConfig, index: int, max_tokens: int) -> dict[str, Any]:
    words = " ".join(WORDS[(index * 7 + i * 3) % len(WORDS)] for i in range(24))
    return {
        "model": "bench",
        "prompt": f"request {index}: {words}",
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": config.temperature,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "seed": 1234 + index,
        "logit_bias": BANNED_END_TOKENS,
    }


async def one_stream(
    client: httpx.AsyncClient, body: dict[str, Any], started: float
) -> tuple[int, float, float]:
    """(completion tokens, TTFT, finish time) of one streamed completion."""
    first_token_at = None
    tokens = None
    finish = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices") or []:
                if choice.get("text") and first_token_at is None:
                    first_token_at = time.perf_counter()
                finish = choice.get("finish_reason") or finish
    ended = time.perf_counter()
    if tokens is None:
        tokens = body["max_tokens"] if finish == "length" else 0
    return tokens, (first_token_at or ended) - started, ended


async def burst(url: str, config: ServerBenchConfig, clients: int) -> tuple[float, list[float]]:
    """All ``clients`` requests at once: (aggregate completion tok/s, TTFTs)."""
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await one_stream(client, request_body(config, 999, 4), time.perf_counter())  # warm up
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                one_stream(client, request_body(config, i, config.max_tokens), started)
                for i in range(clients)
            )
        )
    total_tokens = sum(tokens for tokens, _, _ in results)
    wall_s = max(ended for _, _, ended in results) - started
    return total_tokens / wall_s, [ttft for _, ttft, _ in results]


# --- the run ----------------------------------------------------------------------------------


def measure(
    config: ServerBenchConfig, log: Callable[[str], None]
) -> dict[tuple[str, int], Measurement]:
    results: dict[tuple[str, int], Measurement] = {}
    for round_index in range(config.rounds):
        log(f"round {round_index + 1}/{config.rounds}")
        for clients in config.concurrency:
            settings = planned_settings(config, clients)
            for name in ("homelab serve", "llama-server"):
                port = free_port()
                command = (
                    ours_command(config, clients, port)
                    if name == "homelab serve"
                    else llama_server_command(config, settings, port)
                )
                idle, tok_s, ttfts = measure_once(command, port, config, clients, log)
                entry = results.setdefault((name, clients), Measurement())
                entry.tok_s.append(tok_s)
                entry.ttft_s += ttfts
                log(
                    f"  {name:<14} {clients:>2} clients {tok_s:8.2f} tok/s  "
                    f"TTFT p50 {statistics.median(ttfts):6.3f} s   (CPUs {idle:.0%} idle before)"
                )
    return results


def measure_once(
    command: list[str],
    port: int,
    config: ServerBenchConfig,
    clients: int,
    log: Callable[[str], None],
) -> tuple[float, float, list[float]]:
    """(idle share before, tok/s, TTFTs); a transport failure restarts the server, twice at most."""
    for attempt in range(3):
        try:
            with running(command, port) as url:
                idle = wait_for_quiet(config.min_idle, config.max_wait_s, log)
                tok_s, ttfts = asyncio.run(burst(url, config, clients))
                return idle, tok_s, ttfts
        except httpx.TransportError as exc:
            log(f"  (attempt {attempt + 1}: {type(exc).__name__}: {exc}; restarting the server)")
            old_port, port = str(port), free_port()
            command = [str(port) if part == old_port else part for part in command]
    raise RuntimeError("the server kept failing; see benchmarks/out/logs/")


def markdown(config: ServerBenchConfig, results: dict[tuple[str, int], Measurement]) -> str:
    lines = [
        "| clients | homelab serve tok/s | llama-server tok/s | ratio | ≥ 0.9x | "
        "TTFT p50 / p95 ours (s) | TTFT p50 / p95 llama-server (s) |",
        "|---:|---:|---:|---:|---|---:|---:|",
    ]
    for clients in config.concurrency:
        ours, theirs = results[("homelab serve", clients)], results[("llama-server", clients)]
        ratio = ours.best_tok_s / theirs.best_tok_s
        lines.append(
            f"| {clients} | {ours.best_tok_s:.1f} | {theirs.best_tok_s:.1f} | {ratio:.2f}x | "
            f"{'yes' if ratio >= 0.9 else 'NO'} | "
            f"{ours.ttft_percentile(0.5):.3f} / {ours.ttft_percentile(0.95):.3f} | "
            f"{theirs.ttft_percentile(0.5):.3f} / {theirs.ttft_percentile(0.95):.3f} |"
        )
    return "\n".join(lines)


def save(config: ServerBenchConfig, results: dict[tuple[str, int], Measurement]) -> Path:
    folder = HERE / "out"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"server-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document = {
        "config": {**config.__dict__, "model": str(config.model)},
        "results": [
            {"server": name, "clients": clients, "tok_s": m.tok_s, "ttft_s": m.ttft_s}
            for (name, clients), m in results.items()
        ],
    }
    path.write_text(json.dumps(document, indent=2))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF to serve (default: the bench demo, Q8_0)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,8,16", help="clients at once (1,8,16)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=512, help="context per slot (512)")
    parser.add_argument(
        "--temperature", type=float, default=0.8, help="0.8 (default sampling); 0 greedy"
    )
    parser.add_argument(
        "--min-idle", type=float, default=0.8, help="idle CPU share to wait for (0.8)"
    )
    parser.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait for it")
    args = parser.parse_args(argv)
    build_tools()
    model = args.model
    if model is None:
        from homelab.gguf.demo import demo_model_path

        model = demo_model_path("llama", "bench", "Q8_0")
    config = ServerBenchConfig(
        model=Path(model),
        threads=args.threads,
        rounds=args.rounds,
        concurrency=tuple(int(n) for n in args.concurrency.split(",")),
        max_tokens=args.max_tokens,
        ctx_per_slot=args.ctx,
        temperature=args.temperature,
        min_idle=args.min_idle,
        max_wait_s=args.max_wait,
    )
    print(
        f"model {config.model} · threads {config.threads} · {config.rounds} rounds", file=sys.stderr
    )
    results = measure(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(markdown(config, results))
    print(f"saved {save(config, results)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
