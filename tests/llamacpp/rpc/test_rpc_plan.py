"""Remote devices in the planner: order, budgets, the explicit split, placement per device.

Pure arithmetic on the worker's reported memory (a WorkerDevice, as the doorway's handshake
returns it), so these run without an RPC build; the real split is in test_rpc_split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from homelab.gguf.reader import read_model
from homelab.hardware.profiles import find_gpu_profile
from homelab.llamacpp.rpc import WorkerDevice
from homelab.planner.budget import (
    DEFAULT_MARGIN_BYTES,
    Hardware,
    host_device,
    profile_gpu,
    remote_device,
)
from homelab.planner.memory import MemoryModel
from homelab.planner.plan import plan_model
from homelab.planner.search import PlanRequest
from homelab.units import GIB, MIB


def _workers(budget: int | None, *free_gib: int) -> Hardware:
    remote = [
        remote_device(
            WorkerDevice(f"127.0.0.1:{50052 + i}", 0, free * GIB, 32 * GIB),
            budget,
            DEFAULT_MARGIN_BYTES,
        )
        for i, free in enumerate(free_gib)
    ]
    return Hardware((host_device(16 * GIB, "test"), *remote), "detected")


def test_remote_devices_are_named_as_llama_cpp_logs_them_and_budgeted() -> None:
    hardware = _workers(None, 8, 4)
    first, second = hardware.gpus
    assert first.name == "RPC0[127.0.0.1:50052]" and first.endpoint == "127.0.0.1:50052"
    assert first.budget_bytes == 8 * GIB - DEFAULT_MARGIN_BYTES and first.overhead_bytes == 0
    assert second.label == "worker 127.0.0.1:50053 · device 0 · 4.00 GiB free"
    assert hardware.rpc_endpoints == ("127.0.0.1:50052", "127.0.0.1:50053")
    assert hardware.tensor_split() == (first.budget_bytes, second.budget_bytes)
    capped = _workers(512 * MIB, 8, 4)
    assert [d.budget_bytes for d in capped.gpus] == [512 * MIB, 512 * MIB]
    assert capped.tensor_split() == (512 * MIB, 512 * MIB)


def test_a_plan_over_workers_carries_them_and_its_split_and_places_by_it(
    demo_model: Callable[..., Path],
) -> None:
    info = read_model(demo_model("llama", "bench"))
    even = plan_model(info, _workers(512 * MIB, 8, 8), verify=False)
    assert even.settings.rpc_servers == ("127.0.0.1:50052", "127.0.0.1:50053")
    assert even.settings.tensor_split == (512 * MIB, 512 * MIB)
    cpu, first, second = even.memory.devices
    assert cpu.kv_bytes == 0 and first.kv_bytes > 0 and second.kv_bytes > 0
    assert first.weights_bytes > 0 and second.weights_bytes > 0
    uneven = plan_model(info, _workers(None, 12, 4), verify=False)
    assert uneven.settings.tensor_split[0] > uneven.settings.tensor_split[1]
    _, big, small = uneven.memory.devices
    assert big.kv_bytes > small.kv_bytes  # layers follow the split


def test_an_rpc_device_takes_no_offloaded_ops(demo_model: Callable[..., Path]) -> None:
    """With blocks left on the CPU, llama.cpp copies the largest of them into the first local
    GPU's compute buffer to run big batches there; an RPC device offers no op offload."""
    info = read_model(demo_model("llama", "bench"))
    remote = _workers(512 * MIB, 8)
    as_local = Hardware((remote.cpu, replace(remote.gpus[0], endpoint=None)), "detected")
    request = PlanRequest(n_gpu_layers=6, ctx=512)
    memory = MemoryModel(info)
    settings = plan_model(info, remote, request, verify=False).settings
    largest = memory.weights.largest_cpu_tensor_bytes(memory.layer_placement(settings, remote), 0)
    assert largest > 0
    remote_compute = memory.estimate(settings, remote).devices[1].compute_bytes
    local_compute = memory.estimate(settings, as_local).devices[1].compute_bytes
    assert local_compute >= remote_compute + largest


def test_several_local_gpus_get_an_explicit_split_too_one_does_not() -> None:
    profile = find_gpu_profile("rtx-4090")
    host = host_device(64 * GIB, "test")
    two = Hardware((host, profile_gpu(profile, 0), profile_gpu(profile, 1)), "profile")
    assert len(two.tensor_split()) == 2 and two.rpc_endpoints == ()
    one = Hardware((host, profile_gpu(profile, 0)), "profile")
    assert one.tensor_split() == ()
