"""``python -m benchmarks.yield_cycles``: yield and resume the GPU again and again under load.

    python -m benchmarks.yield_cycles                 # 50 cycles, 4 streaming clients
    python -m benchmarks.yield_cycles --cycles 10     # a short run

One ``homelab serve MODEL`` (default the tiny demo model, 4 slots, loopback) in a child
process; 4 clients stream chat completions without pause while the main thread asks the
server to yield (``POST /admin/yield {"wait": true}``, the grace period short so that some
streams are ended) and to resume, ``--cycles`` times. Every answer is checked: a stream must
either complete (a finish reason, then ``[DONE]``) or end with the yield's error event (its
message says the GPU was given back); a refused request must be a 503 with ``Retry-After``
and the ``server_yielded`` code. Anything else (another status, a broken or truncated stream,
unparsable JSON, a transport error) is lost or garbled. After each resume the server's RSS
and open file descriptors are read: they must stay flat once the first cycles have warmed
the allocator up.

Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
WARM_CYCLES = 5  # RSS and fds are compared from here on


def start_server(model: str, grace_s: float, wait_s: float) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "homelab.cli", "serve", model, "--port", "0", "--json"]
    argv += ["--ctx", "1024", "--parallel", "4", "--threads", "2", "--model-id", "m"]
    argv += ["--yield-grace", str(grace_s), "--yield-wait", str(wait_s)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert server.stdout is not None
    url = json.loads(server.stdout.readline())["base_url"].removesuffix("/v1")
    deadline = time.monotonic() + 120
    while httpx.get(f"{url}/health").status_code != 200:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not load its model in 120 s")
        time.sleep(0.2)
    return server, url


def classify_stream(response: httpx.Response) -> str:
    """completed | ended (by the yield, saying so) | garbled."""
    finished, done, ended = False, False, False
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            ended = "gave its GPU back" in chunk["error"].get("message", "")
            if not ended:
                return "garbled"
            continue
        finished = finished or any(c.get("finish_reason") for c in chunk.get("choices", ()))
    if ended:
        return "ended"
    return "completed" if finished and done else "garbled"


def one_request(http: httpx.Client, n: int) -> str:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"Tell me a story number {n % 7}."}],
        "max_tokens": 24,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code == 503:
                response.read()
                error = response.json().get("error", {})
                ok = "Retry-After" in response.headers and error.get("code") == "server_yielded"
                return "refused" if ok else "garbled"
            if response.status_code != 200:
                return f"status {response.status_code}"
            return classify_stream(response)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return f"lost ({type(exc).__name__})"


def client(url: str, stop: threading.Event, outcomes: Counter[str], lock: threading.Lock) -> None:
    n = 0
    with httpx.Client(base_url=url, timeout=60) as http:
        while not stop.is_set():
            outcome = one_request(http, n)
            n += 1
            with lock:
                outcomes[outcome] += 1


def cycle(http: httpx.Client, process: psutil.Process) -> dict[str, Any]:
    yielded = http.post("/admin/yield", json={"wait": True}).json()
    time.sleep(0.2)  # clients wait (or are refused) meanwhile
    resumed = http.post("/admin/resume").json()
    last = resumed["last"]
    cache = http.get("/admin/prompt-cache").json()
    return {
        "state": resumed["state"],
        "yield_s": last["yield_s"],
        "resume_s": last["resume_s"],
        "ended": last["ended_requests"],
        "rss_freed_bytes": yielded["last"]["rss_freed_bytes"],
        "vram_freed_bytes": yielded["last"]["vram_freed_bytes"],  # NVML; None without a GPU
        "cache_ram_bytes": cache.get("ram_bytes", 0),  # saved states, kept by design
        "rss_bytes": process.memory_info().rss,
        "fds": process.num_fds(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    server, url = start_server(args.model, args.grace, args.wait)
    process = psutil.Process(server.pid)
    stop, lock, outcomes = threading.Event(), threading.Lock(), Counter[str]()
    threads = [threading.Thread(target=client, args=(url, stop, outcomes, lock)) for _ in range(4)]
    for thread in threads:
        thread.start()
    rows = []
    started = time.perf_counter()
    try:
        with httpx.Client(base_url=url, timeout=600) as http:
            for i in range(args.cycles):
                rows.append(cycle(http, process))
                time.sleep(args.serve_s)
                print(f"cycle {i + 1}: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        server.terminate()
        server.wait(30)
    return summary(rows, outcomes, time.perf_counter() - started)


def summary(rows: list[dict[str, Any]], outcomes: Counter[str], took_s: float) -> dict[str, Any]:
    warm = rows[min(WARM_CYCLES, len(rows) - 1)]
    last = rows[-1]
    bad = {k: v for k, v in outcomes.items() if k not in ("completed", "ended", "refused")}
    return {
        "cycles": len(rows),
        "took_s": round(took_s, 1),
        "all_resumed": all(r["state"] == "serving" for r in rows),
        "yield_s_median": round(statistics.median(r["yield_s"] for r in rows), 3),
        "yield_s_max": round(max(r["yield_s"] for r in rows), 3),
        "resume_s_median": round(statistics.median(r["resume_s"] for r in rows), 3),
        "resume_s_max": round(max(r["resume_s"] for r in rows), 3),
        "rss_freed_mib_median": round(
            statistics.median(r["rss_freed_bytes"] for r in rows) / 2**20, 1
        ),
        "rss_mib_after_warm_up": round(warm["rss_bytes"] / 2**20, 1),
        "rss_mib_at_end": round(last["rss_bytes"] / 2**20, 1),
        "cache_ram_mib_after_warm_up": round(warm["cache_ram_bytes"] / 2**20, 1),
        "cache_ram_mib_at_end": round(last["cache_ram_bytes"] / 2**20, 1),
        "vram_freed_mib_median": _median_mib([r["vram_freed_bytes"] for r in rows]),
        "fds_after_warm_up": warm["fds"],
        "fds_at_end": last["fds"],
        "requests_ended_by_yields": sum(r["ended"] for r in rows),
        "outcomes": dict(outcomes),
        "lost_or_garbled": sum(bad.values()),
    }


def _median_mib(values: list[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known) / 2**20, 1) if known else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--grace", type=float, default=0.3, help="--yield-grace (s)")
    parser.add_argument("--wait", type=float, default=0.5, help="--yield-wait (s)")
    parser.add_argument("--serve-s", type=float, default=1.0, help="serving time per cycle")
    result = run(parser.parse_args())
    print(json.dumps(result, indent=2))
    return 0 if result["lost_or_garbled"] == 0 and result["all_resumed"] else 1


if __name__ == "__main__":
    sys.exit(main())
