"""``homelab worker``: offer this machine's devices to another homelab over llama.cpp's RPC.

    homelab worker                       # 127.0.0.1:50052, every GPU (the CPU when none)
    homelab worker --port 50053 --device CPU
    homelab worker --host 10.0.0.5 --allow-network   # a WireGuard/Tailscale address

The RPC protocol has no authentication and llama.cpp's server has had memory-safety bugs
reachable by any client, so the worker binds loopback unless ``--allow-network`` is given
(reach it from elsewhere through an SSH tunnel: README, "RPC workers"). It runs until Ctrl-C
or SIGTERM, which stop it at once with exit code 0.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from homelab.errors import ConfigError
from homelab.units import format_size

READY_TIMEOUT_S = 10.0
NETWORK_WARNING = (
    "WARNING: llama.cpp's RPC protocol has no authentication and its server has had "
    "memory-safety bugs reachable by any client. Anyone who can reach {endpoint} can use "
    "and possibly take over this process. Make it reachable only over a private link "
    "(WireGuard, Tailscale, an SSH tunnel), never an open network."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=50052, help="TCP port (50052)")
    parser.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="NAME",
        help="device to offer (CUDA0, CPU…; repeatable; default: every GPU, else the CPU)",
    )
    parser.add_argument(
        "--cache", metavar="DIR", help="keep received tensors here, so reloads skip the transfer"
    )
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: cores)")
    parser.add_argument(
        "--allow-network",
        action="store_true",
        help="allow binding an address other than loopback (unauthenticated protocol!)",
    )


def run(args: argparse.Namespace) -> int:
    endpoint = _endpoint(args.host, args.port, allow_network=args.allow_network)
    from homelab.llamacpp.rpc import serve, worker_devices

    devices = worker_devices(tuple(args.device))
    threads = args.threads or _default_threads()
    cache = Path(args.cache).expanduser() if args.cache else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    _check_port_free(args.host, args.port, endpoint)
    failed, stop = threading.Event(), threading.Event()
    for stop_signal in (signal.SIGTERM, signal.SIGINT):  # before anyone knows we are up
        signal.signal(stop_signal, lambda *_: stop.set())

    def server() -> None:
        serve(endpoint, devices, cache, threads)
        failed.set()  # serve returns only when it could not start (or its socket died)

    _c_output_to_stderr()
    threading.Thread(target=server, name="rpc-worker", daemon=True).start()
    if not _wait_listening(args.host, args.port, failed):
        raise ConfigError(
            f"The RPC worker could not listen on {endpoint}.",
            hint="Is the port already in use? Choose another with --port.",
        )
    _announce(endpoint, devices, threads, cache, as_json=args.json)
    return _wait_for_stop(failed, stop, sys.stderr if args.json else sys.stdout)


def _endpoint(host: str, port: int, *, allow_network: bool) -> str:
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port.")
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not is_loopback(host):
        if not allow_network:
            raise ConfigError(
                f"Refusing to bind the RPC worker to {host}: llama.cpp's RPC protocol has no "
                "authentication, so anyone who can reach the port can use this machine.",
                hint="Bind 127.0.0.1 and reach it through an SSH tunnel (README, RPC "
                "workers), or pass --allow-network for an address on a private link "
                "(WireGuard, Tailscale).",
            )
        print(f"homelab: {NETWORK_WARNING.format(endpoint=endpoint)}", file=sys.stderr, flush=True)
    return endpoint


def _check_port_free(host: str, port: int, endpoint: str) -> None:
    """Bind the address once ourselves: llama.cpp's server only prints a failure to bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as trial:
        trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            trial.bind((host.strip("[]"), port))
        except OSError as error:
            raise ConfigError(
                f"The RPC worker could not listen on {endpoint}: {error.strerror or error}.",
                hint="Is the port already in use? Choose another with --port.",
            ) from error


def _c_output_to_stderr() -> None:
    """llama.cpp's server prints its banner and every connection with C ``printf``: send that
    to stderr, so stdout carries only homelab's own lines (one JSON document with --json)."""
    sys.stdout.flush()
    own_stdout = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = open(own_stdout, "w", buffering=1, encoding="utf-8", closefd=True)  # noqa: SIM115


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _default_threads() -> int:
    from homelab.engine.loader import default_threads

    return default_threads()


def _wait_listening(host: str, port: int, failed: threading.Event) -> bool:
    """Whether the worker accepts connections (connect and hang up: it serves the next one)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    target = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    while time.monotonic() < deadline and not failed.is_set():
        try:
            with socket.create_connection((target.strip("[]"), port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _announce(
    endpoint: str, devices: tuple[object, ...], threads: int, cache: Path | None, *, as_json: bool
) -> None:
    from homelab.llamacpp.rpc import LocalDevice

    offered = [d for d in devices if isinstance(d, LocalDevice)]
    if as_json:
        document = {
            "endpoint": endpoint,
            "threads": threads,
            "cache": str(cache) if cache else None,
            "devices": [
                {
                    "name": d.name,
                    "description": d.description,
                    "free_bytes": d.free_bytes,
                    "total_bytes": d.total_bytes,
                }
                for d in offered
            ],
        }
        print(json.dumps(document), flush=True)
        return
    print(f"homelab worker listening on {endpoint} ({threads} threads)", flush=True)
    for d in offered:
        free, total = format_size(d.free_bytes), format_size(d.total_bytes)
        print(f"  {d.name} · {d.description} · {free} free of {total}", flush=True)
    print(f"  tensor cache: {cache}" if cache else "  tensor cache: off", flush=True)
    print(f"Use it with: homelab serve MODEL --rpc {endpoint}   (Ctrl-C stops)", flush=True)


def _wait_for_stop(failed: threading.Event, stop: threading.Event, out: TextIO) -> int:
    while not stop.is_set() and not failed.is_set():
        stop.wait(0.2)
    print("homelab worker stopped" if not failed.is_set() else "homelab worker failed", file=out)
    sys.stdout.flush()
    sys.stderr.flush()
    # llama.cpp's server loop never returns: leave without unwinding the thread inside it
    os._exit(1 if failed.is_set() else 0)
