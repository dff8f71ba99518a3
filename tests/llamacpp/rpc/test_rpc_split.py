"""A model split over two real ``homelab worker`` processes on loopback, as planned.

The plan lists the host and one device per worker, each with its bytes; the loader passes the
planner's tensor split, so llama.cpp's buffers on each worker are the planned weights and KV
cache (to the 0.01 MiB its log prints); greedy text is the text of a local load. The OpenAI
SDK against ``homelab serve --rpc``, and a worker killed mid-generation:
``test_rpc_worker_loss.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpc_workers import Worker, free_port

from homelab.units import GIB, MIB

CHILD = Path(__file__).with_name("rpc_child.py")
PROMPT = "The quick brown fox"
LOG_RESOLUTION_BYTES = MIB // 100  # llama.cpp logs MiB with two decimals
WORKER_BUDGET = str(1 * GIB)


def run_child(
    model: Path, endpoints: tuple[str, ...] = (), *split: str, budget: str = WORKER_BUDGET
) -> dict[str, Any]:
    """``split``: ``("none", "1")`` — a split mode and a main device for the plan."""
    command = [sys.executable, str(CHILD), str(model), PROMPT]
    if endpoints:
        command += [",".join(endpoints), budget, *split]
    finished = subprocess.run(
        command, capture_output=True, text=True, timeout=240, check=False, env=os.environ.copy()
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return dict(json.loads(finished.stdout.strip().splitlines()[-1]))


def test_split_over_two_workers_is_the_plan_and_the_local_text(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> None:
    model = demo_model("llama", "bench")
    first, second = start_worker(), start_worker()
    split = run_child(model, (first.endpoint, second.endpoint))
    local = run_child(model)

    planned = {d["name"]: d for d in split["planned"]}
    names = [f"RPC0[{first.endpoint}]", f"RPC0[{second.endpoint}]"]
    assert list(planned) == ["CPU", *names]
    assert split["settings"]["rpc_servers"] == [first.endpoint, second.endpoint]
    assert len(split["settings"]["tensor_split"]) == 2
    for name in names:
        device = planned[name]
        assert device["weights_bytes"] > 0 and device["kv_bytes"] > 0  # each holds a part
        assert device["budget_bytes"] == 1 * GIB  # --rpc-budget, honoured
        assert abs(split["buffers"]["model"][name] - device["weights_bytes"]) <= (
            LOG_RESOLUTION_BYTES
        )
        assert abs(split["buffers"]["kv"][name] - device["kv_bytes"]) <= LOG_RESOLUTION_BYTES
    assert planned["CPU"]["kv_bytes"] == 0  # every layer's cache lives with its layer
    assert split["text"] and split["text"] == local["text"]


def test_plan_shows_each_worker_and_the_split(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> None:
    first, second = start_worker(), start_worker()
    command = [sys.executable, "-m", "homelab.cli", "plan", str(demo_model("llama", "bench"))]
    command += ["--rpc", f"{first.endpoint},{second.endpoint}", "--rpc-budget", WORKER_BUDGET]
    finished = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, env=os.environ.copy()
    )
    assert finished.returncode == 0, finished.stderr
    out = finished.stdout
    for worker in (first, second):
        assert f"RPC0[{worker.endpoint}]: worker {worker.endpoint} · device 0 · " in out
    assert "tensor split RPC0" in out and "(passed to llama.cpp as planned)" in out
    assert "RPC workers (unauthenticated" in out


def test_plan_with_an_unreachable_worker_names_it_before_loading() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "homelab.cli", "plan", "demo:llama", "--rpc", endpoint]
    finished = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, env=os.environ.copy()
    )
    assert finished.returncode == 1
    assert f"RPC worker {endpoint} is unreachable" in finished.stderr


LOAD_TWICE = """
import sys
from homelab.llamacpp.model import Model, ModelParams

path, endpoint = sys.argv[1], sys.argv[2]
with Model.load(path, ModelParams(rpc_servers=(endpoint,), allocate=False)) as remote:
    print(f"RPC0[{endpoint}] model buffer" in remote.load_log)
with Model.load(path, ModelParams(allocate=False)) as local:
    print("RPC0[" in local.load_log)
"""


def test_a_later_load_without_workers_stays_off_them(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> None:
    """ggml keeps a registered worker for the whole process, and llama.cpp's default device
    list would then include it: a load without ``rpc_servers`` must name its devices."""
    worker = start_worker()
    command = [sys.executable, "-c", LOAD_TWICE, str(demo_model("llama")), worker.endpoint]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert finished.stdout.split() == ["True", "False"]
