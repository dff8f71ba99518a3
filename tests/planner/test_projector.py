"""The vision projector in a plan: weights from its GGUF, the warm-up buffer measured once by
loading it alone (recorded), the device it goes on, and the per-image token budget.

Real generated projectors (``homelab.gguf.demo_vision``) and real llama.cpp for the
measurement; GPUs are described from numbers (no GPU here), as in the other planner tests.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from planner_helpers import GIB, cpu_hardware, vram_hardware

from homelab.errors import PlanError
from homelab.gguf import demo_vision
from homelab.gguf.projector import ProjectorInfo, read_projector
from homelab.gguf.reader import read_model
from homelab.llamacpp.mtmd import ProjectorParams
from homelab.llamacpp.mtmd_probe import probe_projector
from homelab.planner.plan import plan_model
from homelab.planner.projector import RECORD_FILE, image_budget, projector_cost
from homelab.planner.render import render_plan
from homelab.planner.search import PlanRequest


@pytest.fixture(scope="module")
def gemma() -> ProjectorInfo:
    return read_projector(demo_vision.mmproj_path("gemma3"))


@pytest.fixture(scope="module")
def qwen() -> ProjectorInfo:
    return read_projector(demo_vision.mmproj_path("qwen2vl"))


def test_image_budget(gemma: ProjectorInfo, qwen: ProjectorInfo) -> None:
    """Gemma 3: its fixed count whatever is asked; Qwen-VL: its 4096 maximum, at most half a
    slot, or what --image-max-tokens says."""
    fixed = demo_vision.fixed_image_tokens("gemma3")
    assert image_budget(gemma, 0, 8192) == image_budget(gemma, 16, 100) == fixed
    assert image_budget(qwen, 0, 0) == image_budget(qwen, 0, 16384) == 4096
    assert image_budget(qwen, 0, 2048) == 1024
    assert image_budget(qwen, 300, 2048) == 300


def test_warmup_buffer_is_measured_once_and_recorded(qwen: ProjectorInfo) -> None:
    probe = probe_projector(qwen.path, ProjectorParams(use_gpu=False))
    assert probe.ok and probe.total_compute_bytes > 0
    assert abs(probe.weights_bytes - qwen.weights_bytes) <= 0.005 * 2**20  # logged in MiB
    cost = projector_cost(qwen, on_gpu=False, image_max_tokens=1024)
    assert (cost.compute_bytes, cost.compute_source) == (probe.total_compute_bytes, "measured")
    assert cost.weights_bytes == qwen.weights_bytes and cost.custom_max_tokens == 1024
    from homelab.locations import cache_dir

    records = json.loads((cache_dir() / RECORD_FILE).read_text())
    assert probe.total_compute_bytes in records.values()
    # images larger than the warm-up (46x46 tokens) grow the buffer in proportion
    full = projector_cost(qwen, on_gpu=False)
    assert full.compute_source == "measured, scaled to 4096 tokens"
    assert full.compute_bytes == -(-probe.total_compute_bytes * 4096 // (46 * 46))


def test_estimate_without_a_dry_run(gemma: ProjectorInfo) -> None:
    cost = projector_cost(gemma, on_gpu=True, measure=False)
    assert cost.compute_source == "estimated" and cost.compute_bytes > 0
    assert cost.image_max_tokens == gemma.fixed_image_tokens and cost.fixed_tokens


def test_a_plan_counts_the_projector_and_loads_it() -> None:
    text = read_model(demo_vision.text_model_path("gemma3"))
    projector = read_projector(demo_vision.mmproj_path("gemma3"))
    request = PlanRequest(ctx=1024, projector=projector)
    plan = plan_model(text, cpu_hardware(), request, verify=False)
    alone = plan_model(text, cpu_hardware(), PlanRequest(ctx=1024), verify=False)
    assert plan.projector is not None and plan.fits
    assert plan.memory.total_bytes - alone.memory.total_bytes == plan.projector.total_bytes
    assert plan.memory.devices[0].projector_bytes == plan.projector.total_bytes
    settings = plan.settings
    assert (settings.mmproj_path, settings.mmproj_offload) == (projector.path, False)
    document = plan.to_dict()
    assert document["projector"]["image_max_tokens"] == projector.fixed_image_tokens
    assert document["memory"]["projector_bytes"] == plan.projector.total_bytes
    assert f"images exactly {projector.fixed_image_tokens} tokens" in render_plan(plan)


def test_a_projector_that_does_not_fit_the_gpu_goes_to_the_cpu_or_says_so() -> None:
    text = read_model(demo_vision.text_model_path("gemma3"))
    huge = replace(read_projector(demo_vision.mmproj_path("gemma3")), weights_bytes=3 * GIB)
    hardware = vram_hardware(2.0)
    auto = plan_model(text, hardware, PlanRequest(ctx=1024, projector=huge), verify=False)
    assert auto.fits and auto.projector is not None and not auto.projector.on_gpu
    assert auto.memory.devices[0].projector_bytes >= 3 * GIB
    assert any("goes on the CPU" in reason for reason in auto.reasons)
    forced = PlanRequest(ctx=1024, projector=huge, mmproj_offload=True)
    with pytest.raises(PlanError, match=r"vision projector 3\.00 GiB") as refused:
        plan_model(text, hardware, forced, verify=False)
    assert "--mmproj-cpu" in str(refused.value)
    small = replace(huge, weights_bytes=64 << 20)
    fits = plan_model(text, hardware, PlanRequest(ctx=1024, projector=small), verify=False)
    assert fits.fits and fits.projector is not None and fits.projector.on_gpu
    assert fits.memory.devices[1].projector_bytes == fits.projector.total_bytes
    assert fits.settings.mmproj_offload is True


@pytest.mark.parametrize("kind", demo_vision.VISION_KINDS)
def test_planned_projector_memory_is_what_llama_cpp_allocates(kind: str) -> None:
    """The plan's weights and warm-up buffer against mtmd's own log when the engine's doorway
    loads the projector for its text model (the same call the engine makes)."""
    from homelab.llamacpp.model import Model
    from homelab.llamacpp.mtmd import Projector
    from homelab.llamacpp.mtmd_probe import parse_probe_log

    info = read_projector(demo_vision.mmproj_path(kind))
    cost = projector_cost(info, on_gpu=False, image_max_tokens=1024)
    with (
        Model.load(demo_vision.text_model_path(kind)) as model,
        Projector.load(info.path, model, ProjectorParams(use_gpu=False)) as projector,
    ):
        allocated = parse_probe_log(projector.creation_log)
    assert cost.compute_bytes == allocated.total_compute_bytes  # same warm-up, exact
    assert abs(cost.weights_bytes - allocated.weights_bytes) <= 0.005 * 2**20  # MiB, 2 decimals


def test_a_lowered_image_budget_is_said_and_passed_to_mtmd(qwen: ProjectorInfo) -> None:
    text = read_model(demo_vision.text_model_path("qwen2vl"))
    request = PlanRequest(ctx=2048, parallel=2, goal="throughput", projector=qwen)
    plan = plan_model(text, cpu_hardware(), request, verify=False)
    assert plan.projector is not None
    assert plan.settings.n_ctx_per_slot == 2048  # throughput: the asked context, many slots
    assert plan.projector.image_max_tokens == plan.settings.image_max_tokens == 1024
    assert any("scaled down" in reason for reason in plan.reasons)
    asked = replace(request, image_max_tokens=300)
    plan = plan_model(text, cpu_hardware(), asked, verify=False)
    assert plan.settings.image_max_tokens == 300
    assert any("300 tokens (as asked" in reason for reason in plan.reasons)
