"""``--split-mode none --main-gpu N`` and ``--split-mode row``, planned and loaded.

llama.cpp counts RPC devices as GPU devices, so two loopback workers are two real offload
devices here: with ``none`` and main device 1 the plan puts every offloaded layer, its KV
cache and the compute buffer on the second worker, and llama.cpp's buffers say the same. The
multi-GPU case is planned over two GPUs detected through a fake NVML (no GPU on the machines
the tests run on; the fake is tests/hardware's).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from rpc_workers import Worker
from test_rpc_split import LOG_RESOLUTION_BYTES, run_child

from homelab.errors import PlanError
from homelab.gguf.reader import read_model
from homelab.hardware.report import detect
from homelab.planner.budget import Hardware, hardware_from_report
from homelab.planner.memory import estimate_memory
from homelab.planner.plan import plan_model
from homelab.planner.search import PlanRequest

sys.path.insert(0, str(Path(__file__).parents[2] / "hardware"))
from test_gpu_detection import CUDA_BUILD, FakeGpu, FakeNvml  # tests/hardware's fake NVML

BIG_BUDGET = str(4 << 30)  # one worker can hold the whole demo model


def test_split_none_puts_everything_on_the_main_worker(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> None:
    first, second = start_worker(), start_worker()
    model = demo_model("llama", "bench")
    result = run_child(model, (first.endpoint, second.endpoint), "none", "1", budget=BIG_BUDGET)
    planned = {d["name"]: d for d in result["planned"]}
    idle, main = f"RPC0[{first.endpoint}]", f"RPC0[{second.endpoint}]"
    assert result["settings"]["split_mode"] == "none" and result["settings"]["main_gpu"] == 1
    assert result["settings"]["tensor_split"] == []  # one device: nothing to split
    assert planned[idle]["total_bytes"] == 0
    assert planned[main]["weights_bytes"] > planned["CPU"]["weights_bytes"]  # all blocks
    assert planned[main]["kv_bytes"] > 0 and planned["CPU"]["kv_bytes"] == 0
    buffers = result["buffers"]
    assert buffers["model"].get(idle, 0) == 0 and buffers["kv"].get(idle, 0) == 0
    assert buffers["compute"].get(idle, 0) == 0
    assert abs(buffers["model"][main] - planned[main]["weights_bytes"]) <= LOG_RESOLUTION_BYTES
    assert abs(buffers["kv"][main] - planned[main]["kv_bytes"]) <= LOG_RESOLUTION_BYTES
    assert buffers["compute"][main] > 0


def test_row_split_over_workers_is_refused_before_loading(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> None:
    worker = start_worker()
    command = [sys.executable, "-m", "homelab.cli", "plan", str(demo_model("llama", "bench"))]
    command += ["--rpc", worker.endpoint, "--split-mode", "row"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 1
    assert "--split-mode row needs CUDA GPUs of this machine only" in finished.stderr
    assert f"RPC0[{worker.endpoint}]" in finished.stderr


def _two_gpus() -> Hardware:
    """Two idle 24 GB GPUs, as NVML (faked) reports them."""
    fake = FakeNvml([FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1")])
    return hardware_from_report(detect(fake, build=CUDA_BUILD))


def test_split_none_on_two_gpus_plans_the_main_gpu_only(demo_model: Callable[..., Path]) -> None:
    hardware = _two_gpus()
    models = [read_model(demo_model("llama", "bench"))]
    layer = plan_model(models, hardware, PlanRequest(ctx=4096), verify=False)
    none = plan_model(
        models, hardware, PlanRequest(ctx=4096, split_mode="none", main_gpu=1), verify=False
    )
    by_layer = {d.name: d for d in layer.memory.devices}
    by_none = {d.name: d for d in none.memory.devices}
    assert by_layer["CUDA0"].weights_bytes > 0 and by_layer["CUDA1"].weights_bytes > 0
    assert len(layer.settings.tensor_split) == 2
    assert by_none["CUDA0"].total_bytes == 0  # no layers, KV, compute or CUDA context
    assert by_none["CUDA1"].weights_bytes == (
        by_layer["CUDA0"].weights_bytes + by_layer["CUDA1"].weights_bytes
    )
    assert by_none["CUDA1"].kv_bytes == by_layer["CUDA0"].kv_bytes + by_layer["CUDA1"].kv_bytes
    assert none.settings.split_mode == "none" and none.settings.tensor_split == ()


def test_row_split_on_cuda_gpus_plans_like_layer(demo_model: Callable[..., Path]) -> None:
    hardware = _two_gpus()
    model = read_model(demo_model("llama", "bench"))
    row = plan_model([model], hardware, PlanRequest(ctx=4096, split_mode="row"), verify=False)
    layer = estimate_memory(model, replace(row.settings, split_mode="layer"), hardware)
    assert row.settings.split_mode == "row"
    assert [d.total_bytes for d in row.memory.devices] == [d.total_bytes for d in layer.devices]


def test_main_gpu_out_of_range_is_a_plan_error(demo_model: Callable[..., Path]) -> None:
    models = [read_model(demo_model("llama", "bench"))]
    with pytest.raises(PlanError, match="--main-gpu 2 names no offload device"):
        plan_model(models, _two_gpus(), PlanRequest(split_mode="none", main_gpu=2), verify=False)


def test_plan_output_names_the_main_worker(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> None:
    first, second = start_worker(), start_worker()
    command = [sys.executable, "-m", "homelab.cli", "plan", str(demo_model("llama", "bench"))]
    command += ["--rpc", f"{first.endpoint},{second.endpoint}", "--rpc-budget", BIG_BUDGET]
    command += ["--split-mode", "none", "--main-gpu", "1"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr
    assert f"split mode none: every offloaded layer on RPC0[{second.endpoint}]" in finished.stdout
    assert "tensor split" not in finished.stdout
