"""``python -m benchmarks.hostile_soak``: normal clients streaming while hostile ones attack.

    python -m benchmarks.hostile_soak                          # 75 s, 8 normal, 4 hostile
    python -m benchmarks.hostile_soak --seconds 30 --clients 4

One ``homelab serve`` (bench demo model, loopback, a keys file), run as a fleet of that one
model (``--models``) so that Ollama's ``keep_alive`` and ``/admin/models`` are in play, and
fetching image URLs on loopback (``--allow-private-image-urls``: the slow image server below is
local). Three tenants: ``alice`` (the normal clients), ``mallory`` (the hostile ones), ``ops``
(admin). For ``--seconds``:

- ``--clients`` normal clients stream chat completions with no think time, each answer
  checked as ``benchmarks/soak.py`` checks them (complete SSE, one finish, usage adding up);
- ``--hostile`` clients loop over issue 39's classes (``benchmarks/hostile_inputs.py``), each
  starting at its own place in the cycle: the RLE8 BMP bomb under an escaped type, Responses
  hosted tools whose type would break a header, a forced call over a million properties,
  absurd ``keep_alive`` values (then ``/admin/models``), an image URL served one byte every
  9 s, image URLs answering broken HTTP, malformed bodies, and streams dropped after their
  first event;
- ``/health`` is asked four times a second from a process of its own, from the start until
  ``HEALTH_TAIL_S`` after ``--seconds`` (the requests in flight then, a slow image URL's
  included, finish within it).

When every client has returned, ``/admin/models`` is polled until no slot is busy and nothing
is in flight. Printed: ``/health`` p50/p99/max, normal answers ok/lost/garbled, hostile
answers by class and status, the seconds until every slot was idle. Passes (exit 0) when
``/health`` p99 < 100 ms, no normal answer is lost or garbled, no hostile request got a 5xx or
lost its connection, and every slot is idle within 2 s. Requests are drawn from generators
seeded by ``--seed`` and the client's number; what runs in a given time depends on the machine.
Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socketserver
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from benchmarks import hostile_inputs as inputs
from benchmarks.llama_tools import HERE
from benchmarks.server_bench import free_port, running
from benchmarks.soak import (
    HEALTH_LIMIT_S,
    Health,
    Tally,
    client_loop,
    collect_health,
    make_request,
    percentile,
    write_keys,
)

TENANTS = {
    "alice": ("hl-hostile-soak-alice-key", 64),
    "mallory": ("hl-hostile-soak-mallory-key", 16),
    "ops": ("hl-hostile-soak-ops-key", 4),
}  # key, max concurrent
IDLE_LIMIT_S = 2.0
HEALTH_TAIL_S = 20.0  # /health is watched this long past --seconds, while the last requests end
DRIBBLE_EVERY_S = 9.0  # the slow image server's pace: one byte, then this long
HOSTILE_TIMEOUT_S = 120.0
CLASSES = (
    "rle-bomb",
    "hosted-tool-type",
    "huge-tool-schema",
    "many-turns",
    "absurd-keep-alive",
    "slow-image-url",
    "broken-image-url",
    "malformed-body",
    "dropped-stream",
)


# --- a local image server that misbehaves --------------------------------------------------


class _EvilHandler(socketserver.BaseRequestHandler):
    """``/slow``: a valid response one byte every DRIBBLE_EVERY_S; ``/bad-status``: no HTTP;
    ``/incomplete``: fewer bytes than its Content-Length."""

    stop: threading.Event

    def handle(self) -> None:
        request = self.request.recv(65536).split(b" ", 2)
        path = request[1] if len(request) > 1 else b""
        try:
            if path.startswith(b"/slow"):
                for byte in b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n\r\n":
                    self.request.sendall(bytes([byte]))
                    if self.stop.wait(DRIBBLE_EVERY_S):
                        return
            elif path.startswith(b"/bad-status"):
                self.request.sendall(b"garbage\r\n\r\n")
            else:
                head = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\nContent-Type: image/png\r\n"
                self.request.sendall(head + b"\r\n" + b"\x89PNG\r\n\x1a\n")
        except OSError:
            return  # the server gave up on us: as it should


@contextmanager
def evil_image_server() -> Iterator[str]:
    stop = threading.Event()
    handler = type("Handler", (_EvilHandler,), {"stop": stop})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


# --- the hostile clients --------------------------------------------------------------------


@dataclass
class Hostile:
    """What the hostile clients got: (class, status or error) -> count, and what went wrong."""

    answers: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # 5xx, lost connections, wrong answers

    def record(self, kind: str, outcome: str, expected: bool, detail: str = "") -> None:
        self.answers[kind, outcome] += 1
        if not expected and len(self.failures) < 200:
            self.failures.append(f"{kind}: {outcome} {detail[:200]}".strip())


@dataclass(frozen=True)
class Target:
    model: str
    images: str  # the evil image server's URL
    classes: tuple[str, ...] = CLASSES


Attack = Callable[[httpx.AsyncClient, Target, int, Hostile], Awaitable[None]]
JSON = {"Content-Type": "application/json"}


async def expect(
    client: httpx.AsyncClient,
    kind: str,
    hostile: Hostile,
    path: str,
    raw: bytes,
    statuses: tuple[int, ...] = (400,),
) -> httpx.Response | None:
    try:
        response = await client.post(path, content=raw, headers=JSON)
    except httpx.HTTPError as exc:
        hostile.record(kind, type(exc).__name__, False, str(exc))
        return None
    expected = response.status_code in statuses
    hostile.record(kind, str(response.status_code), expected, "" if expected else response.text)
    return response


async def rle_bomb(client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile) -> None:
    raw = rle_bomb_body(target.model)
    await expect(client, "rle-bomb", hostile, "/v1/chat/completions", raw)


@cache
def rle_bomb_body(model: str) -> bytes:
    """The RLE8 bomb under an escaped type (8 MB of base64: built once)."""
    return inputs.escaped_image_body(model, inputs.rle8_bmp_with_noops())


async def hosted_tool_type(
    client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile
) -> None:
    tool_type = inputs.BAD_TOOL_TYPES[n % len(inputs.BAD_TOOL_TYPES)]
    body = inputs.hosted_tool_body(target.model, tool_type, stream=n % 2 == 1, max_output_tokens=16)
    response = await expect(
        client, "hosted-tool-type", hostile, "/v1/responses", json.dumps(body).encode(), (200,)
    )
    warning = response.headers.get("Warning", "") if response is not None else ""
    if (
        response is not None
        and response.status_code == 200
        and not (warning.isascii() and "\r" not in warning and "\n" not in warning and warning)
    ):
        hostile.record("hosted-tool-type", "bad Warning header", False, repr(warning))


async def huge_tool_schema(
    client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile
) -> None:
    raw = huge_schema_body(target.model)
    await expect(client, "huge-tool-schema", hostile, "/v1/chat/completions", raw)


@cache
def huge_schema_body(model: str) -> bytes:
    """A forced call over a million properties (~25 MB: built once)."""
    return inputs.many_properties_body(model)


async def many_turns(client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile) -> None:
    raw = many_turns_body(target.model)
    await expect(client, "many-turns", hostile, "/v1/messages", raw)


@cache
def many_turns_body(model: str) -> bytes:
    """16,000 Anthropic turns: parsed (just under the object bound), then too long a prompt."""
    return inputs.many_turns_body(model)


async def absurd_keep_alive(
    client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile
) -> None:
    value = inputs.ABSURD_KEEP_ALIVES[n % len(inputs.ABSURD_KEEP_ALIVES)]
    raw = inputs.keep_alive_body(target.model, value)
    await expect(client, "absurd-keep-alive", hostile, "/api/chat", raw)
    admin = {"Authorization": f"Bearer {TENANTS['ops'][0]}"}
    try:
        listed = await client.get("/admin/models", headers=admin)
        hostile.record("admin-models-after", str(listed.status_code), listed.status_code == 200)
    except httpx.HTTPError as exc:
        hostile.record("admin-models-after", type(exc).__name__, False, str(exc))


async def slow_image_url(
    client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile
) -> None:
    body = inputs.image_url_body(target.model, f"{target.images}/slow-{n}.png")
    await expect(
        client, "slow-image-url", hostile, "/v1/chat/completions", json.dumps(body).encode()
    )


async def broken_image_url(
    client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile
) -> None:
    where = ("bad-status", "incomplete")[n % 2]
    body = inputs.image_url_body(target.model, f"{target.images}/{where}-{n}.png")
    raw = json.dumps(body).encode()
    await expect(client, "broken-image-url", hostile, "/v1/chat/completions", raw)


async def malformed_body(
    client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile
) -> None:
    bodies = inputs.malformed_bodies(target.model)
    path, raw = bodies[n % len(bodies)]
    await expect(client, "malformed-body", hostile, path, raw)


async def dropped_stream(
    client: httpx.AsyncClient, target: Target, n: int, hostile: Hostile
) -> None:
    """A long stream left after its first event: the server must cancel it."""
    body = {
        "model": target.model,
        "max_tokens": 400,
        "stream": True,
        "messages": [{"role": "user", "content": f"tell me a long story, number {n}"}],
    }
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                hostile.record("dropped-stream", str(response.status_code), False, response.text)
                return
            async for _ in response.aiter_lines():
                break
        hostile.record("dropped-stream", "dropped after the first event", True)
    except httpx.HTTPError as exc:
        hostile.record("dropped-stream", type(exc).__name__, False, str(exc))


ATTACKS: dict[str, Attack] = {
    "rle-bomb": rle_bomb,
    "hosted-tool-type": hosted_tool_type,
    "huge-tool-schema": huge_tool_schema,
    "many-turns": many_turns,
    "absurd-keep-alive": absurd_keep_alive,
    "slow-image-url": slow_image_url,
    "broken-image-url": broken_image_url,
    "malformed-body": malformed_body,
    "dropped-stream": dropped_stream,
}


async def hostile_loop(
    url: str, index: int, deadline: float, target: Target, hostile: Hostile
) -> None:
    """Client ``index`` runs the classes in order from its own starting place until
    ``deadline`` (each request is let finish)."""
    headers = {"Authorization": f"Bearer {TENANTS['mallory'][0]}"}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=HOSTILE_TIMEOUT_S
    ) as client:
        n = index
        while time.monotonic() < deadline:
            kind = target.classes[n % len(target.classes)]
            await ATTACKS[kind](client, target, n // len(target.classes), hostile)
            n += 1


# --- after the mix ---------------------------------------------------------------------------


async def seconds_until_idle(url: str, limit_s: float = 30.0) -> tuple[float, list[Any]]:
    """Poll ``/admin/models`` until no slot is busy and nothing is in flight: (seconds it
    took, or inf past ``limit_s``; the last rows)."""
    admin = {"Authorization": f"Bearer {TENANTS['ops'][0]}"}
    started = time.monotonic()
    rows: list[Any] = []
    async with httpx.AsyncClient(base_url=url, headers=admin, timeout=10) as client:
        while time.monotonic() - started < limit_s:
            rows = (await client.get("/admin/models")).json()["data"]
            if not any(r["slots_busy"] or r["requests_in_flight"] for r in rows):
                return time.monotonic() - started, rows
            await asyncio.sleep(0.05)
    return float("inf"), rows


@dataclass
class Outcome:
    tally: Tally
    health: Health
    hostile: Hostile
    mix_s: float  # from the start until every client had returned
    idle_s: float
    idle_rows: list[Any]


def hostile_process(
    url: str, seeds: list[int], seconds: float, target: Target, out: Connection
) -> None:
    """The hostile clients, in a process of their own: building and sending their bodies
    (25 MB of them) must not slow the normal clients' loop, whose timings are measured."""
    hostile = Hostile()
    rle_bomb_body(target.model), huge_schema_body(target.model), many_turns_body(target.model)
    deadline = time.monotonic() + seconds

    async def run_all() -> None:
        await asyncio.gather(*(hostile_loop(url, s, deadline, target, hostile) for s in seeds))

    asyncio.run(run_all())
    out.send(hostile)
    out.close()


async def hostile_mix(url: str, args: argparse.Namespace, target: Target) -> Hostile:
    spawn = multiprocessing.get_context("spawn")
    receiver, sender = spawn.Pipe(duplex=False)
    seeds = [args.seed + i for i in range(args.hostile)]
    process = spawn.Process(
        target=hostile_process, args=(url, seeds, args.seconds, target, sender), daemon=True
    )
    process.start()
    sender.close()
    hostile: Hostile = await asyncio.to_thread(receiver.recv)
    await asyncio.to_thread(process.join, 10)
    return hostile


async def soak(args: argparse.Namespace, url: str, target: Target) -> Outcome:
    tally, health = Tally(), Health()
    started = time.monotonic()
    deadline = started + args.seconds
    chat = partial(make_request, model=target.model, chat_share=1.0, stream_share=1.0)
    normal_key = TENANTS["alice"][0]

    async def mix() -> tuple[Hostile, float, float, list[Any]]:
        normal = asyncio.gather(
            *(
                client_loop(url, normal_key, args.seed + i, False, deadline, tally, chat)
                for i in range(args.clients)
            )
        )
        hostile, _ = await asyncio.gather(hostile_mix(url, args, target), normal)
        mix_s = time.monotonic() - started
        idle_s, rows = await seconds_until_idle(url)
        return hostile, mix_s, idle_s, rows

    _, (hostile, mix_s, idle_s, rows) = await asyncio.gather(
        collect_health(url, args.seconds + HEALTH_TAIL_S, health), mix()
    )
    return Outcome(tally, health, hostile, mix_s, idle_s, rows)


# --- the run ------------------------------------------------------------------------------


def passed(outcome: Outcome) -> bool:
    checks = outcome.health.latencies_s
    return (
        bool(checks)
        and percentile(checks, 0.99) < HEALTH_LIMIT_S
        and not outcome.health.failures
        and not outcome.tally.bad
        and not outcome.tally.lost
        and not outcome.hostile.failures
        and outcome.idle_s <= IDLE_LIMIT_S
    )


def report(args: argparse.Namespace, outcome: Outcome, load: tuple[float, float]) -> str:
    tally, health = outcome.tally, outcome.health
    checks = health.latencies_s or [float("nan")]
    slow = sum(1 for s in checks if s > HEALTH_LIMIT_S)
    ms = [f"{statistics.median(checks) * 1000:.1f}"]
    ms += [f"{percentile(checks, 0.99) * 1000:.1f}", f"{max(checks) * 1000:.1f}"]
    ttft = [f"{percentile(tally.ttft_s, q) * 1000:.0f}" for q in (0.5, 0.95)]
    answers = f"{tally.served} / {len(tally.lost)} / {len(tally.bad)}"
    rows = [
        ("mix", f"{args.seconds:.0f} s asked, {outcome.mix_s:.1f} s until every client returned"),
        ("clients", f"{args.clients} normal (streaming chat), {args.hostile} hostile"),
        ("server", f"{args.slots} slots, {args.threads} threads, {args.model}"),
        ("load average (1 min) before / after", f"{load[0]:.2f} / {load[1]:.2f}"),
        ("/health checks (failed)", f"{len(health.latencies_s)} ({len(health.failures)})"),
        ("/health p50 / p99 / max", " / ".join(ms) + " ms"),
        (f"/health over {HEALTH_LIMIT_S * 1000:.0f} ms", str(slow)),
        ("normal answers ok / lost / garbled", answers),
        ("normal refusals (429/503, clean)", str(sum(tally.refused.values()))),
        ("normal TTFT p50 / p95", " / ".join(ttft) + " ms"),
    ]  # fmt: skip
    for kind in (*CLASSES, "admin-models-after"):
        seen = {o: c for (k, o), c in sorted(outcome.hostile.answers.items()) if k == kind}
        rows.append((f"hostile: {kind}", ", ".join(f"{c} × {o}" for o, c in seen.items()) or "—"))
    rows += [
        ("hostile 5xx / lost / unexpected", str(len(outcome.hostile.failures))),
        ("seconds until every slot idle", f"{outcome.idle_s:.2f}"),
        ("verdict", "PASS" if passed(outcome) else "FAIL"),
    ]
    return "\n".join(["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


def serve_command(args: argparse.Namespace, keys: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "homelab.cli", "serve", "--models", args.model,
        "--port", str(port), "--api-key-file", str(keys), "--keep-alive", "-1",
        "--ctx", "512", "--parallel", str(args.slots), "--goal", "throughput",
        "--threads", str(args.threads), "--allow-private-image-urls",
    ]  # fmt: skip


def warm_up(url: str, model: str) -> None:
    """Load the model and run one request, so the mix does not time the first load."""
    admin = {"Authorization": f"Bearer {TENANTS['ops'][0]}"}
    loaded = httpx.post(
        url + "/admin/models/load", json={"model": model}, headers=admin, timeout=300
    )
    loaded.raise_for_status()
    body = {"model": model, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {TENANTS['alice'][0]}"}
    httpx.post(
        url + "/v1/chat/completions", json=body, headers=headers, timeout=120
    ).raise_for_status()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--clients", type=int, default=8, help="normal clients (8)")
    parser.add_argument("--hostile", type=int, default=4, help="hostile clients (4)")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="demo:bench:Q8_0")
    parser.add_argument(
        "--only", default=",".join(CLASSES), help="the hostile classes, comma-separated (all)"
    )
    args = parser.parse_args(argv)
    classes = tuple(c for c in args.only.split(",") if c)
    if not classes or set(classes) - set(CLASSES):
        parser.error(f"--only takes some of: {', '.join(CLASSES)}")
    keys = HERE / "out" / "hostile-soak-keys.toml"
    write_keys(keys, TENANTS, admins=("ops",))
    port = free_port()
    with running(serve_command(args, keys, port), port) as server, evil_image_server() as images:
        warm_up(server.url, args.model)
        load_before = os.getloadavg()[0]
        outcome = asyncio.run(soak(args, server.url, Target(args.model, images, classes)))
        load_after = os.getloadavg()[0]
    print(report(args, outcome, (load_before, load_after)))
    for line in (outcome.tally.lost + outcome.tally.bad + outcome.hostile.failures)[:20]:
        print("  failure:", line, file=sys.stderr)
    save(args, outcome)
    return 0 if passed(outcome) else 1


def save(args: argparse.Namespace, outcome: Outcome) -> None:
    out = HERE / "out" / f"hostile-soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    record = {
        "args": vars(args),
        "served": outcome.tally.served,
        "lost": outcome.tally.lost,
        "garbled": outcome.tally.bad,
        "hostile": {f"{k} {o}": c for (k, o), c in sorted(outcome.hostile.answers.items())},
        "hostile_failures": outcome.hostile.failures,
        "health_s": outcome.health.latencies_s,
        "health_at_s": outcome.health.at_s,
        "health_failures": outcome.health.failures,
        "mix_s": outcome.mix_s,
        "idle_s": outcome.idle_s,
        "idle_rows": outcome.idle_rows,
    }
    out.write_text(json.dumps(record, indent=1))
    print(f"saved {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
