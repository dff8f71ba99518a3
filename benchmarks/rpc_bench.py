"""``python -m benchmarks.rpc_bench``: the cost of llama.cpp's RPC itself — tok/s of a local
load vs the same model split over two ``homelab worker`` processes on loopback.

    python -m benchmarks.rpc_bench                       # demo:bench, 3 runs each
    python -m benchmarks.rpc_bench --model demo:bench --runs 5 --threads 1 --tokens 64

Every contender computes with the same number of threads (the workers get ``--threads``, the
local load too), so the difference is the transport: each decode step sends the activations
to worker 1, then worker 2, and the logits back. Both workers and the main process share this
machine's cores. A harness, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks.server_bench import free_port

PROMPT = "Write a long story about memory, machines and the people who run them."


@contextmanager
def workers(count: int, threads: int) -> Iterator[list[str]]:
    processes, endpoints = [], []
    try:
        for _ in range(count):
            port = free_port()
            command = [sys.executable, "-m", "homelab.cli", "worker", "--port", str(port)]
            command += ["--device", "CPU", "--threads", str(threads)]
            process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            processes.append(process)
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("Use it with"):
                    break
            endpoints.append(f"127.0.0.1:{port}")
        yield endpoints
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def one_run(model: str, tokens: int, threads: int, rpc: list[str]) -> dict[str, float]:
    command = [sys.executable, "-m", "homelab.cli", "run", model, "--prompt", PROMPT, "--json"]
    command += ["--max-tokens", str(tokens), "--temperature", "0", "--ignore-eos"]
    command += ["--threads", str(threads), "--ctx", "512"]
    if rpc:
        command += ["--rpc", ",".join(rpc), "--rpc-budget", "1GiB"]
    finished = subprocess.run(
        command, capture_output=True, text=True, check=True, env=os.environ.copy()
    )
    stats = json.loads(finished.stdout)["stats"]
    return {"prefill": float(stats["prefill_tok_s"]), "decode": float(stats["decode_tok_s"])}


def series(model: str, runs: int, tokens: int, threads: int, rpc: list[str]) -> dict[str, float]:
    results = [one_run(model, tokens, threads, rpc) for _ in range(runs)]
    return {
        "prefill_tok_s": statistics.median(r["prefill"] for r in results),
        "decode_tok_s": statistics.median(r["decode"] for r in results),
        "decode_min": min(r["decode"] for r in results),
        "decode_max": max(r["decode"] for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo:bench")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    table = {"local": series(args.model, args.runs, args.tokens, args.threads, [])}
    with workers(2, args.threads) as endpoints:
        table["2 loopback workers"] = series(
            args.model, args.runs, args.tokens, args.threads, endpoints
        )
    print("| load | prefill tok/s | decode tok/s (median) | decode min – max |")
    print("|------|--------------:|----------------------:|------------------|")
    for name, row in table.items():
        print(
            f"| {name} | {row['prefill_tok_s']:.0f} | {row['decode_tok_s']:.1f} | "
            f"{row['decode_min']:.1f} – {row['decode_max']:.1f} |"
        )
    print(json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
