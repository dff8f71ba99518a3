"""``python -m benchmarks.soak``: ``homelab serve`` under more load than it can serve, for minutes.

    python -m benchmarks.soak                      # 64 clients, 5 minutes, 8 slots
    python -m benchmarks.soak --seconds 30         # a short run

One ``homelab serve`` (bench demo model, 8 slots, 2 threads, loopback only) with a keys file
of two tenants, each allowed fewer concurrent requests than its clients send, so the server
must refuse some. 64 clients loop with no think time until ``--seconds`` have passed, each
request picked at random among chat and text completions, streaming or not, 8–48 tokens, from
a small set of prompts (so the prefix cache hits and misses). About 10 % of the clients drop
every stream after its third event. A well-behaved client: a refusal (429/503) is retried
after the ``Retry-After`` it carries.

Every answer is checked: a 200 must be well-formed (JSON or a complete SSE stream ending in
``[DONE]``, one finish per choice) and its usage must add up (completion tokens = max_tokens,
end of text being banned; total = prompt + completion; the same prompt always counts the same
prompt tokens). A refusal must be a 429 or 503 with a ``Retry-After`` and the OpenAI error
envelope. Anything else — another status, a broken stream, a transport error on a request the
client did not drop — is lost or garbled, and must not happen. Meanwhile ``/health`` is asked
four times a second (it must answer within 100 ms) and the server's RSS is sampled.

Not part of ``make test``: it takes minutes and wants a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from benchmarks.llama_tools import HERE
from benchmarks.server_bench import (
    BANNED_END_TOKENS,
    WORDS,
    free_port,
    process_rss_bytes,
    running,
)
from homelab.server.auth import hash_key

TENANTS = {
    "alice": ("hl-soak-alice-key", 20),
    "bob": ("hl-soak-bob-key", 12),
}  # key, max concurrent
HEALTH_LIMIT_S = 0.1
HEALTH_EVERY_S = 0.25
DROP_AFTER_EVENTS = 3
PROMPTS = 12  # distinct prompts per kind: repeats hit the prefix cache


@dataclass
class Tally:
    served: int = 0
    refused: Counter[int] = field(default_factory=Counter)  # clean 429/503, by status
    dropped: int = 0  # streams the client itself cut short
    bad: list[str] = field(default_factory=list)  # garbled (a 200 not as it should be): none
    lost: list[str] = field(default_factory=list)  # no answer (an error, a broken transfer): none
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: dict[str, int] = field(default_factory=dict)  # prompt -> prompt tokens
    tokens: int = 0

    def garbled(self, what: str) -> None:
        if len(self.bad) < 1000:
            self.bad.append(what)

    def lose(self, what: str) -> None:
        if len(self.lost) < 1000:
            self.lost.append(what)


@dataclass
class Health:
    latencies_s: list[float] = field(default_factory=list)
    at_s: list[float] = field(default_factory=list)  # when each check was made, from the start
    failures: list[str] = field(default_factory=list)


# --- one request --------------------------------------------------------------------------


def make_request(
    rng: random.Random, model: str = "bench", chat_share: float = 0.5, stream_share: float = 0.5
) -> tuple[str, dict[str, Any], str]:
    """(path, body, prompt key) of a random request: a chat completion ``chat_share`` of the
    time (else a text completion), streamed ``stream_share`` of the time."""
    chat = rng.random() < chat_share
    n = rng.randrange(PROMPTS)
    words = " ".join(WORDS[(n * 7 + i * 3) % len(WORDS)] for i in range(8 + 4 * n))
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": rng.randint(8, 48),
        "stream": rng.random() < stream_share,
        "logit_bias": BANNED_END_TOKENS,
        "seed": rng.randrange(1 << 30),
    }
    if chat:
        body["messages"] = [{"role": "user", "content": f"question {n}: {words}"}]
    else:
        body["prompt"] = f"text {n}: {words}"
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return path, body, f"{path} {n}"


def check_usage(tally: Tally, usage: Any, body: dict[str, Any], key: str) -> None:
    if not isinstance(usage, dict):
        tally.garbled(f"{key}: no usage")
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if completion != body["max_tokens"]:
        tally.garbled(f"{key}: {completion} completion tokens for max_tokens {body['max_tokens']}")
    if (
        not isinstance(prompt, int)
        or prompt < 1
        or usage.get("total_tokens") != prompt + (completion or 0)
    ):
        tally.garbled(f"{key}: usage does not add up: {usage}")
        return
    if tally.prompt_tokens.setdefault(key, prompt) != prompt:
        tally.garbled(f"{key}: {prompt} prompt tokens, earlier {tally.prompt_tokens[key]}")
    tally.tokens += completion or 0


def check_answer(tally: Tally, data: Any, body: dict[str, Any], key: str) -> None:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or len(choices) != 1:
        tally.garbled(f"{key}: malformed answer {str(data)[:200]}")
        return
    choice = choices[0]
    text = choice.get("text") if "prompt" in body else (choice.get("message") or {}).get("content")
    if not isinstance(text, str) or choice.get("finish_reason") != "length":
        tally.garbled(f"{key}: malformed choice {str(choice)[:200]}")
    check_usage(tally, data.get("usage"), body, key)


async def non_streaming(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], key: str, tally: Tally
) -> float:
    response = await client.post(path, json=body)
    if response.status_code != 200:
        return refusal(tally, response, key)
    try:
        data = response.json()
    except ValueError:
        tally.garbled(f"{key}: body is not JSON")
        return 0.0
    check_answer(tally, data, body, key)
    tally.served += 1
    return 0.0


async def streaming(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    key: str,
    tally: Tally,
    drop: bool,
) -> float:
    started = time.perf_counter()
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return refusal(tally, response, key)
        events: list[Any] = []
        done = False
        first_text_at: float | None = None
        async for line in response.aiter_lines():
            if not line:
                continue
            if done or not line.startswith("data: "):
                tally.garbled(f"{key}: unexpected line {line[:80]!r}")
                return 0.0
            if line == "data: [DONE]":
                done = True
                continue
            events.append(json.loads(line[6:]))
            if first_text_at is None and _has_text(events[-1]):
                first_text_at = time.perf_counter()
                tally.ttft_s.append(first_text_at - started)
            if drop and len(events) >= DROP_AFTER_EVENTS:
                tally.dropped += 1
                return 0.0  # leaving the block closes the connection mid-stream
    check_stream(tally, events, done, body, key)
    tally.served += 1
    return 0.0


def _has_text(event: Any) -> bool:
    for choice in event.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def check_stream(
    tally: Tally, events: list[Any], done: bool, body: dict[str, Any], key: str
) -> None:
    if not done:
        tally.garbled(f"{key}: stream ended without [DONE]")
        return
    if any("error" in event for event in events):
        tally.garbled(f"{key}: error event {events[-1]}")
        return
    ids = {event.get("id") for event in events}
    finishes = [
        c.get("finish_reason")
        for e in events
        for c in e.get("choices") or []
        if c.get("finish_reason")
    ]
    if len(ids) != 1 or finishes != ["length"]:
        tally.garbled(f"{key}: {len(ids)} ids, finishes {finishes}")
    check_usage(tally, events[-1].get("usage") if events else None, body, key)


def refusal(tally: Tally, response: httpx.Response, key: str) -> float:
    """Count a clean refusal and return how long to wait; anything else is lost."""
    retry_after = response.headers.get("Retry-After", "")
    try:
        error = response.json()["error"]
        clean = (
            response.status_code in (429, 503)
            and retry_after.isdigit()
            and int(retry_after) >= 1
            and set(error) == {"message", "type", "param", "code"}
        )
    except (ValueError, KeyError, TypeError):
        clean = False
    if not clean:
        tally.lose(f"{key}: status {response.status_code} {response.text[:200]}")
        return 0.0
    tally.refused[response.status_code] += 1
    return float(retry_after)


# --- clients and watchers -----------------------------------------------------------------


RequestMaker = Callable[[random.Random], tuple[str, dict[str, Any], str]]


async def client_loop(
    url: str,
    api_key: str,
    index: int,
    drop: bool,
    deadline: float,
    tally: Tally,
    make: RequestMaker = make_request,
) -> None:
    """One client's requests (``make``, from a generator seeded by ``index``) until
    ``deadline``, each answer checked into ``tally``."""
    rng = random.Random(index)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:
        while time.monotonic() < deadline:
            path, body, key = make(rng)
            if drop:
                body["stream"], body["stream_options"] = True, {"include_usage": True}
            try:
                if body["stream"]:
                    wait_s = await streaming(client, path, body, key, tally, drop)
                else:
                    wait_s = await non_streaming(client, path, body, key, tally)
            except (httpx.HTTPError, ValueError) as exc:
                tally.lose(f"{key}: {type(exc).__name__}: {exc}")
                wait_s = 1.0
            await asyncio.sleep(min(wait_s, max(0.0, deadline - time.monotonic())))


def watch_health(url: str, seconds: float, out: Connection) -> None:
    """Ask /health on a connection of its own, in a process of its own: neither the clients'
    event loop nor their GIL may be counted as the server's latency. Sends (offset from the
    start in s, latency in s, failure or "") for every check, then None."""
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=5) as client:
        while time.monotonic() - started < seconds:
            asked = time.perf_counter()
            failure = ""
            try:
                response = client.get("/health")
                if response.status_code != 200:
                    failure = f"status {response.status_code}"
            except httpx.HTTPError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            out.send((time.monotonic() - started, time.perf_counter() - asked, failure))
            time.sleep(HEALTH_EVERY_S)
    out.send(None)
    out.close()


async def collect_health(url: str, seconds: float, health: Health) -> None:
    receiver, sender = multiprocessing.get_context("spawn").Pipe(duplex=False)
    watcher = multiprocessing.get_context("spawn").Process(
        target=watch_health, args=(url, seconds, sender), daemon=True
    )
    watcher.start()
    sender.close()
    while (check := await asyncio.to_thread(receiver.recv)) is not None:
        at_s, latency_s, failure = check
        health.latencies_s.append(latency_s)
        health.at_s.append(at_s)
        if failure:
            health.failures.append(f"at {at_s:.1f} s: {failure}")
    await asyncio.to_thread(watcher.join, 10)


async def watch_rss(pid: int, deadline: float, samples: list[int]) -> None:
    while time.monotonic() < deadline:
        samples.append(process_rss_bytes(pid))
        await asyncio.sleep(5)


async def soak(
    url: str, pid: int, seconds: float, clients: int
) -> tuple[Tally, Health, list[int], float]:
    tally, health, rss = Tally(), Health(), [process_rss_bytes(pid)]
    deadline = time.monotonic() + seconds
    droppers = set(range(clients - 1, -1, -10)[: round(clients / 10)])  # ~10 % of the clients
    names = list(TENANTS)
    started = time.monotonic()
    await asyncio.gather(
        collect_health(url, seconds, health),
        watch_rss(pid, deadline, rss),
        *(
            client_loop(url, TENANTS[names[i % 2]][0], i, i in droppers, deadline, tally)
            for i in range(clients)
        ),
    )
    return tally, health, rss, time.monotonic() - started


async def idle_state(url: str) -> dict[str, float]:
    """Slots and queue once the load has stopped (the dropped streams must have been freed)."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for _ in range(50):
            text = (await client.get("/metrics")).text
            values = {
                line.split("{")[0].split()[0]: float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith(("homelab_slots_active", "homelab_queue_depth"))
            }
            if not any(values.values()):
                return values
            await asyncio.sleep(0.2)
        return values


# --- the run ------------------------------------------------------------------------------


def write_keys(
    path: Path, tenants: dict[str, tuple[str, int]] = TENANTS, admins: tuple[str, ...] = ()
) -> None:
    """A keys file: each tenant's key (hashed) and concurrency limit; ``admins`` may use the
    admin routes."""
    lines = ["[keys]"]
    lines += [f'"{hash_key(key)}" = "{name}"' for name, (key, _) in tenants.items()]
    for name, (_, limit) in tenants.items():
        lines += [f"[tenants.{name}]", f"max_concurrent_requests = {limit}"]
        lines += ["admin = true"] if name in admins else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def report(
    args: argparse.Namespace,
    tally: Tally,
    health: Health,
    rss: list[int],
    after: int,
    elapsed_s: float,
    idle: dict[str, float],
) -> str:
    mib = 1 << 20
    slow = [
        (at, s) for at, s in zip(health.at_s, health.latencies_s, strict=True) if s > HEALTH_LIMIT_S
    ]
    slow_at = ", ".join(f"{s * 1000:.0f} ms at {at:.0f} s" for at, s in slow[:5])
    slow_at = f"({slow_at})" if slow else ""
    refused = ", ".join(f"{count} × {status}" for status, count in sorted(tally.refused.items()))
    ttft = (
        f"{statistics.median(tally.ttft_s) * 1000:.0f} / "
        f"{percentile(tally.ttft_s, 0.95) * 1000:.0f} ms"
        if tally.ttft_s
        else "—"
    )
    checks = health.latencies_s or [float("nan")]
    rows = [
        ("duration", f"{elapsed_s:.0f} s, {args.clients} clients, {args.slots} slots"),
        ("clients dropping every stream", str(round(args.clients / 10))),
        ("requests served (200, checked)", str(tally.served)),
        ("completion tokens", f"{tally.tokens} ({tally.tokens / elapsed_s:.0f} tok/s)"),
        ("refused, clean (Retry-After)", refused or "0"),
        ("streams dropped by the client", str(tally.dropped)),
        ("lost or garbled", str(len(tally.lost) + len(tally.bad))),
        ("TTFT p50 / p95 (streams)", ttft),
        ("RSS after warm-up", f"{rss[0] / mib:.1f} MiB"),
        ("RSS max during / after", f"{max(rss) / mib:.1f} / {after / mib:.1f} MiB"),
        ("/health checks", f"{len(health.latencies_s)}, {len(health.failures)} failed"),
        (
            "/health max / p99",
            f"{max(checks) * 1000:.0f} / {percentile(checks, 0.99) * 1000:.0f} ms",
        ),
        (f"/health over {HEALTH_LIMIT_S * 1000:.0f} ms", f"{len(slow)} {slow_at}".strip()),
        ("slots active / queue after", " / ".join(f"{v:.0f}" for v in idle.values()) or "?"),
    ]
    lines = ["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="demo:bench:Q8_0")
    args = parser.parse_args(argv)
    keys = HERE / "out" / "soak-keys.toml"
    write_keys(keys)
    port = free_port()
    command = [
        sys.executable, "-m", "homelab.cli", "serve", args.model, "--port", str(port),
        "--model-id", "bench", "--ctx", "512", "--parallel", str(args.slots),
        "--goal", "throughput", "--threads", str(args.threads), "--api-key-file", str(keys),
    ]  # fmt: skip
    with running(command, port) as server:
        warm = {"model": "bench", "prompt": "warm up", "max_tokens": 4}
        headers = {"Authorization": f"Bearer {TENANTS['alice'][0]}"}
        httpx.post(server.url + "/v1/completions", json=warm, headers=headers, timeout=60)
        tally, health, rss, elapsed_s = asyncio.run(
            soak(server.url, server.pid, args.seconds, args.clients)
        )
        idle = asyncio.run(idle_state(server.url))
        time.sleep(2)
        after = process_rss_bytes(server.pid)
    print(report(args, tally, health, rss, after, elapsed_s, idle))
    for line in (tally.lost + tally.bad)[:20]:
        print("  lost/garbled:", line, file=sys.stderr)
    out = HERE / "out" / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "served": tally.served,
                "refused": dict(tally.refused),
                "dropped": tally.dropped,
                "bad": tally.bad,
                "lost": tally.lost,
                "ttft_s": tally.ttft_s,
                "health_s": health.latencies_s,
                "health_at_s": health.at_s,
                "health_failures": health.failures,
                "rss_bytes": [*rss, after],
                "idle": idle,
            },
            indent=1,
        )
    )
    print(f"saved {out}", file=sys.stderr)
    return 0 if not tally.bad and not tally.lost and not health.failures else 1


if __name__ == "__main__":
    sys.exit(main())
