"""``python -m benchmarks.agent_bench``: an agent session's TTFT per turn, as Claude Code sends it.

    python -m benchmarks.agent_bench                      # demo:bench, a 6K-token session, 5 turns
    python -m benchmarks.agent_bench --model demo:bench --prefix-tokens 6000 --turns 5

Starts ``homelab serve MODEL --ctx --parallel 2`` (the real CLI path) and replays the Claude Code
trace of ``tests/server/traces/claude_code.json`` twice, its system prompt padded to about
``--prefix-tokens`` (counted by ``/v1/messages/count_tokens``): once with Claude Code's
``x-anthropic-billing-header`` block changed on every request, once without it. Each session
starts with its own marker, so neither reuses the other's cache. TTFT is measured from the
request sent to the first ``content_block_delta`` (or the ``message_delta`` when no text came).
The target (issue #24): turn 5's TTFT at most a tenth of turn 1's, with and without the
header. A harness, not a test: it prints a Markdown table and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "server" / "traces" / "claude_code.json"
HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "unused-on-loopback"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(model: str, ctx: int, port: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "homelab.cli", "serve", model, "--ctx", str(ctx),
        "--parallel", "2", "--port", str(port), "--alias", "claude-*=agent", "--model-id", "agent",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError("the server did not become healthy in 10 minutes")


def turn_bodies(turns: int) -> list[dict[str, Any]]:
    calls = json.loads(TRACE.read_text())["calls"]
    return [c["body"] for c in calls if c.get("turn")][:turns]


def padded_system(http: httpx.Client, body: dict[str, Any], target: int) -> str:
    """The trace's main system text, repeated until the first turn's prompt is ~``target``."""
    text = body["system"][-1]["text"]
    base = count(http, {**body, "system": [{"type": "text", "text": text}]})
    per_copy = max(1, count(http, {**body, "system": [{"type": "text", "text": text * 2}]}) - base)
    copies = max(1, 1 + (target - base) // per_copy)
    return "\n\n".join([text] * copies)


def count(http: httpx.Client, body: dict[str, Any]) -> int:
    fields = {k: body[k] for k in ("model", "messages", "tools", "system")}
    response = http.post("/v1/messages/count_tokens", json=fields, headers=HEADERS)
    response.raise_for_status()
    return int(response.json()["input_tokens"])


def session(
    http: httpx.Client, bodies: list[dict[str, Any]], system: str, marker: str, billing: bool
) -> list[tuple[float, int, int]]:
    """(TTFT s, prompt tokens, cached tokens) per turn."""
    rows = []
    for turn, body in enumerate(bodies, 1):
        blocks = [{"type": "text", "text": f"{marker}\n{system}"}]
        if billing:
            cch = f"{(turn * 40503) & 0xFFFFF:05x}"
            header = (
                f"x-anthropic-billing-header: cc_version=2.1.37.4f1; cc_entrypoint=cli; cch={cch};"
            )
            blocks.insert(0, {"type": "text", "text": header})
        rows.append(timed(http, {**body, "system": blocks, "max_tokens": 8}))
    return rows


def timed(http: httpx.Client, body: dict[str, Any]) -> tuple[float, int, int]:
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, int] = {}
    with http.stream("POST", "/v1/messages", json=body, headers=HEADERS) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] in ("content_block_delta", "message_delta") and first is None:
                first = time.perf_counter() - started
            if event["type"] == "message_delta":
                usage = event["usage"]
    cached = usage.get("cache_read_input_tokens", 0)
    return first or 0.0, usage.get("input_tokens", 0) + cached, cached


def markdown(results: dict[str, list[tuple[float, int, int]]]) -> str:
    lines = ["| session | turn | prompt tokens | cached | TTFT ms |", "|---|---|---|---|---|"]
    for name, rows in results.items():
        for turn, (ttft, prompt, cached) in enumerate(rows, 1):
            lines.append(f"| {name} | {turn} | {prompt} | {cached} | {ttft * 1000:.0f} |")
        ratio = rows[-1][0] / rows[0][0] if rows[0][0] else float("nan")
        lines.append(f"| {name} | turn {len(rows)} / turn 1 | | | {ratio:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo:bench")
    parser.add_argument("--prefix-tokens", type=int, default=6000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args(argv)
    port = free_port()
    process = start_server(args.model, args.ctx, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            bodies = turn_bodies(args.turns)
            system = padded_system(http, bodies[0], args.prefix_tokens)
            results = {
                "billing header": session(http, bodies, system, "session A", billing=True),
                "no header": session(http, bodies, system, "session B", billing=False),
            }
    finally:
        process.terminate()
        process.wait(timeout=30)
    print(f"model {args.model}, cpu count {os.cpu_count()}")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
