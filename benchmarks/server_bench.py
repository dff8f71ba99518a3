"""``python -m benchmarks.server_bench``: ``homelab serve`` vs ``llama-server -np N``, steady state.

    python -m benchmarks.server_bench                         # 1, 8, 16 clients, 5 rounds
    python -m benchmarks.server_bench --concurrency 8 --rounds 7 --max-tokens 128

What a user sees after the first minute, not the best burst. For each concurrency N, ONE
``homelab serve`` (N slots) and ONE ``llama-server -np N`` are started side by side with the
same model and llama.cpp settings (the ones ``homelab serve --ctx --parallel N --goal
throughput --threads T`` plans, passed to llama-server as ``-c -np -t -fa -b -ub -ctk -ctv
-kvu/-no-kvu``) and kept running for every round. Each round runs four workloads, N clients
at once, each client ``/v1/completions`` requests of ``--max-tokens`` tokens one after another
(end of text banned, llama.cpp's default sampling): one each, or as many as make
``--min-requests`` a round (8: one client sends 8 in turn — a round of one ~0.1 s request
read ±10% from request to request, more than the difference to be measured):

- streaming or not (a non-streaming client waits for the whole answer, as most SDK calls do);
- prompts that repeat every round (the server's prefix cache may serve them) or prompts seen
  for the first time.

Contenders alternate workload by workload (A, B, A, B…; the order flips every round), each
waiting for the CPUs to be mostly idle first, so a noisy neighbour hits both alike. Persistent
HTTP connections are kept across rounds, as a long-running client would.

Reported per concurrency and workload, for both servers side by side: the first round, the
median and the worst of the later rounds (aggregate completion tok/s: all tokens / wall time
from the first request sent to the last byte received, prefill included), the server
process's CPU seconds per generated token (all its threads, from /proc), the part of it spent
outside the decoding threads (the event loop, or llama-server's HTTP threads), and TTFT p50 for
the streaming workloads. The target: ours ≥ 0.9x llama-server in the first round and in the median
of the later ones, at every concurrency, streaming and not. A harness, not a test: nothing
asserts.
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
OURS, THEIRS = "homelab serve", "llama-server"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Workload:
    name: str
    stream: bool
    repeat: bool  # the same prompts every round (prefix-cache hits) or new ones


WORKLOADS = (
    Workload("stream, repeated prompts", stream=True, repeat=True),
    Workload("stream, new prompts", stream=True, repeat=False),
    Workload("no stream, repeated prompts", stream=False, repeat=True),
    Workload("no stream, new prompts", stream=False, repeat=False),
)


@dataclass(frozen=True)
class ServerBenchConfig:
    model: Path
    threads: int = 2
    rounds: int = 5
    concurrency: tuple[int, ...] = (1, 8, 16)
    max_tokens: int = 128
    prompt_words: int = 48
    ctx_per_slot: int = 512
    temperature: float = 0.8  # llama.cpp's default sampling (0: greedy)
    min_idle: float = 0.8
    max_wait_s: float = 20.0
    workloads: tuple[Workload, ...] = WORKLOADS
    prompt_cache: bool = True  # homelab serve's default; llama-server runs with -cram 0
    min_requests: int = 8  # per round: each of N clients sends ceil(min_requests / N) in turn

    def requests_per_client(self, clients: int) -> int:
        return max(1, -(-self.min_requests // clients))


@dataclass(frozen=True)
class Round:
    """One workload, one server, one round."""

    tok_s: float
    tokens: int
    wall_s: float
    cpu_s: float  # the server process's CPU time during the round
    serving_cpu_s: float  # ... of its threads but the decode team (see serving_cpu_s)
    idle_before: float  # share of idle CPU when the round started
    ttft_s: tuple[float, ...]  # streaming only: time to the first text of each request
    latency_s: tuple[float, ...]  # time to the end of each request


@dataclass
class Series:
    rounds: list[Round] = field(default_factory=list)

    @property
    def first(self) -> float:
        return self.rounds[0].tok_s if self.rounds else float("nan")

    @property
    def later(self) -> list[float]:
        return [r.tok_s for r in self.rounds[1:]] or [self.first]

    @property
    def median(self) -> float:
        return statistics.median(self.later)

    @property
    def worst(self) -> float:
        return min(self.later)

    @property
    def cpu_per_token_ms(self) -> float:
        return 1000 * statistics.median(r.cpu_s / max(r.tokens, 1) for r in self.rounds)

    @property
    def serving_cpu_per_token_us(self) -> float:
        return 1e6 * statistics.median(r.serving_cpu_s / max(r.tokens, 1) for r in self.rounds)

    @property
    def ttft_p50(self) -> float | None:
        ttfts = [t for r in self.rounds for t in r.ttft_s]
        return statistics.median(ttfts) if ttfts else None


Results = dict[tuple[int, str, str], Series]  # (clients, workload, server) -> rounds


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
        *(() if config.prompt_cache else ("--no-prompt-cache",)),
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
        "-ngl", str(999 if settings.n_gpu_layers < 0 else settings.n_gpu_layers),
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class RunningServer:
    url: str
    pid: int


@contextmanager
def running(
    command: list[str], port: int, env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    """Start a server process, wait for ``/health`` 200, yield it, stop it."""
    home = os.environ.get("HOMELAB_HOME", str(HERE / "out" / "home"))
    env = {**os.environ, "HOMELAB_HOME": home, **(env or {})}
    log_path = HERE / "out" / "logs" / f"{Path(command[0]).name}-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(process, url, log_path)
            yield RunningServer(url, process.pid)
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


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process, to the nanosecond (Linux
    /proc/PID/task/TID/schedstat: its first field is the time run on a CPU; the clock ticks
    of ``stat`` are 10 ms, 39 µs a token over a 256-token request)."""
    seconds: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            seconds[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except FileNotFoundError:  # the thread has ended
            continue
    return seconds


def serving_cpu_s(before: dict[int, float], after: dict[int, float], n_decode: int) -> float:
    """CPU seconds of the threads that do not decode: all but the ``n_decode`` busiest of the
    round (llama.cpp's OpenMP team — homelab's compute lane and its workers, llama-server's
    slot thread and its workers: they spin at ggml's barriers, so they are the busiest).
    What is left is each server's own serving: the event loop, or the HTTP threads."""
    used = sorted((after[tid] - before.get(tid, 0.0) for tid in after), reverse=True)
    return sum(used[n_decode:])


def process_rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES


# --- the clients ------------------------------------------------------------------------------


def request_body(
    config: ServerBenchConfig, workload: Workload, round_index: int, index: int
) -> dict[str, Any]:
    words = " ".join(WORDS[(index * 7 + i * 3) % len(WORDS)] for i in range(config.prompt_words))
    tag = f"request {index}" if workload.repeat else f"round {round_index} request {index}"
    body: dict[str, Any] = {
        "model": "bench",
        "prompt": f"{tag} ({workload.name}): {words}",
        "max_tokens": config.max_tokens,
        "stream": workload.stream,
        "temperature": config.temperature,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "seed": 1234 + index,
        "logit_bias": BANNED_END_TOKENS,
    }
    if workload.stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def one_request(
    client: httpx.AsyncClient, body: dict[str, Any], started: float
) -> tuple[int, float | None, float]:
    """(completion tokens, TTFT or None, end time) of one completion sent at ``started``."""
    if not body["stream"]:
        response = await client.post("/v1/completions", json=body)
        response.raise_for_status()
        return int(response.json()["usage"]["completion_tokens"]), None, time.perf_counter()
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


async def one_round(
    client: httpx.AsyncClient,
    server: RunningServer,
    config: ServerBenchConfig,
    workload: Workload,
    round_index: int,
    clients: int,
) -> Round:
    idle = await asyncio.to_thread(wait_for_quiet, config.min_idle, config.max_wait_s, _quiet)
    per_client = config.requests_per_client(clients)
    bodies = [
        [request_body(config, workload, round_index, c + k * clients) for k in range(per_client)]
        for c in range(clients)
    ]
    cpu_before, threads_before = process_cpu_s(server.pid), thread_cpu_s(server.pid)
    started = time.perf_counter()
    per_task = await asyncio.gather(*(one_client(client, each) for each in bodies))
    results = [result for task in per_task for result in task]
    wall_s = max(ended for _, _, _, ended in results) - started
    cpu_s = process_cpu_s(server.pid) - cpu_before
    serving_s = serving_cpu_s(threads_before, thread_cpu_s(server.pid), config.threads)
    tokens = sum(tokens for tokens, _, _, _ in results)
    return Round(
        tok_s=tokens / wall_s,
        tokens=tokens,
        wall_s=wall_s,
        cpu_s=cpu_s,
        serving_cpu_s=serving_s,
        idle_before=idle,
        ttft_s=tuple(ttft for _, ttft, _, _ in results if ttft is not None),
        latency_s=tuple(ended - sent for _, ttft, sent, ended in results),
    )


async def one_client(
    client: httpx.AsyncClient, bodies: list[dict[str, Any]]
) -> list[tuple[int, float | None, float, float]]:
    """One client's requests, each sent when the one before has ended: (completion tokens,
    TTFT or None, sent, ended) each. A request sent on a kept-alive connection that the
    server closed as it went out (llama-server closes one after a few requests; it answers
    nothing) is sent again on a new one, its time counted from the first try."""
    results = []
    for body in bodies:
        sent = time.perf_counter()
        for attempt in range(3):
            try:
                tokens, ttft, ended = await one_request(client, body, sent)
                break
            except httpx.RemoteProtocolError:
                if attempt == 2:
                    raise
        results.append((tokens, ttft, sent, ended))
    return results


async def warm_up(client: httpx.AsyncClient, config: ServerBenchConfig) -> None:
    """One short request, not measured. llama-server sometimes drops the first connection
    after /health turns 200 ("Server disconnected without sending a response"): retry."""
    body = {**request_body(config, WORKLOADS[1], -1, 999), "max_tokens": 4}
    for attempt in range(3):
        try:
            await one_request(client, body, time.perf_counter())
            return
        except httpx.TransportError:
            await asyncio.sleep(1 + attempt)
    await one_request(client, body, time.perf_counter())


def _quiet(line: str) -> None:
    pass  # wait_for_quiet's "machine busy" lines: the idle share is recorded per round instead


# --- the run ----------------------------------------------------------------------------------


def measure(config: ServerBenchConfig, log: Callable[[str], None]) -> Results:
    results: Results = {}
    for clients in config.concurrency:
        settings = planned_settings(config, clients)
        ours_port, theirs_port = free_port(), free_port()
        with (
            running(ours_command(config, clients, ours_port), ours_port) as ours,
            running(llama_server_command(config, settings, theirs_port), theirs_port) as theirs,
        ):
            per_client = config.requests_per_client(clients)
            log(
                f"{clients} clients, {per_client} request(s) each a round: "
                f"{OURS} pid {ours.pid}, {THEIRS} pid {theirs.pid}"
            )
            servers = {OURS: ours, THEIRS: theirs}
            asyncio.run(_rounds(config, clients, servers, results, log))
    return results


async def _rounds(
    config: ServerBenchConfig,
    clients: int,
    servers: dict[str, RunningServer],
    results: Results,
    log: Callable[[str], None],
) -> None:
    # idle connections dropped before either server's keep-alive (5 s for llama-server) ends:
    # a connection reused as the server closes it fails the request with a read error
    limits = httpx.Limits(
        max_connections=clients + 4, max_keepalive_connections=clients + 4, keepalive_expiry=2.0
    )
    connections = {
        name: httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits)
        for name, server in servers.items()
    }
    try:
        for client in connections.values():
            await warm_up(client, config)
        for round_index in range(config.rounds):
            order = list(servers) if round_index % 2 == 0 else list(servers)[::-1]
            for workload in config.workloads:
                for name in order:
                    measured = await one_round(
                        connections[name], servers[name], config, workload, round_index, clients
                    )
                    series = results.setdefault((clients, workload.name, name), Series())
                    series.rounds.append(measured)
                    log(
                        f"  round {round_index + 1} {workload.name:<28} {name:<14} "
                        f"{measured.tok_s:7.1f} tok/s  cpu {measured.cpu_s:5.2f} s  "
                        f"(idle {measured.idle_before:.0%} before)"
                    )
    finally:
        for client in connections.values():
            await client.aclose()


def markdown(config: ServerBenchConfig, results: Results) -> str:
    lines = [
        "| clients | workload | first round ours / llama-server | ratio | "
        "median later rounds ours / llama-server | ratio | worst later round ours / "
        "llama-server | ratio | CPU ms per token ours / llama-server | serving threads µs "
        "per token ours / llama-server | TTFT p50 ours / llama-server |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for clients in config.concurrency:
        for workload in config.workloads:
            ours = results[(clients, workload.name, OURS)]
            theirs = results[(clients, workload.name, THEIRS)]
            ttft = (
                f"{ours.ttft_p50 * 1000:.0f} / {theirs.ttft_p50 * 1000:.0f} ms"
                if ours.ttft_p50 is not None and theirs.ttft_p50 is not None
                else "—"
            )
            lines.append(
                f"| {clients} | {workload.name} "
                f"| {ours.first:.1f} / {theirs.first:.1f} | {_ratio(ours.first, theirs.first)} "
                f"| {ours.median:.1f} / {theirs.median:.1f} "
                f"| {_ratio(ours.median, theirs.median)} "
                f"| {ours.worst:.1f} / {theirs.worst:.1f} | {_ratio(ours.worst, theirs.worst)} "
                f"| {ours.cpu_per_token_ms:.2f} / {theirs.cpu_per_token_ms:.2f} "
                f"| {ours.serving_cpu_per_token_us:.0f} / {theirs.serving_cpu_per_token_us:.0f} "
                f"| {ttft} |"
            )
    return "\n".join(lines)


def _ratio(ours: float, theirs: float) -> str:
    ratio = ours / theirs
    return f"{ratio:.2f}x" if ratio >= 0.9 else f"**{ratio:.2f}x**"


def save(config: ServerBenchConfig, results: Results) -> Path:
    folder = HERE / "out"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"server-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document = {
        "config": {
            **{k: v for k, v in config.__dict__.items() if k != "workloads"},
            "model": str(config.model),
            "workloads": [w.__dict__ for w in config.workloads],
        },
        "load_average": os.getloadavg(),
        "results": [
            {
                "clients": clients,
                "workload": workload,
                "server": server,
                "rounds": [r.__dict__ for r in series.rounds],
            }
            for (clients, workload, server), series in results.items()
        ],
    }
    path.write_text(json.dumps(document, indent=2))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF to serve (default: the bench demo, Q8_0)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", default="1,8,16", help="clients at once (1,8,16)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=512, help="context per slot (512)")
    parser.add_argument(
        "--min-requests",
        type=int,
        default=8,
        help="requests a round at least: fewer clients send several in turn (8)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.8, help="0.8 (default sampling); 0 greedy"
    )
    parser.add_argument(
        "--min-idle", type=float, default=0.8, help="idle CPU share to wait for (0.8)"
    )
    parser.add_argument("--max-wait", type=float, default=20.0, help="seconds to wait for it")
    parser.add_argument(
        "--no-prompt-cache",
        action="store_true",
        help="homelab serve keeps no state beyond its slot, as llama-server here (-cram 0)",
    )
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
        prompt_cache=not args.no_prompt_cache,
        min_requests=args.min_requests,
    )
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    log(f"model {config.model} · threads {config.threads} · {config.rounds} rounds")
    log(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results = measure(config, log)
    log(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(markdown(config, results))
    log(f"saved {save(config, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
