"""What bench and quality ask the planner: the planned configuration, and what fits.

``--budget BYTES`` replaces the budget of the device the model runs on (the first GPU, or the
host when there is none) so a user — and the tests — can see on a CPU where each K/V type
runs out of room. Every "fits / does not fit" in the concurrency table is the planner's
answer for exactly that (slots, context, K/V type) with every layer on the GPU, never a
guess of our own.
"""

from __future__ import annotations

from dataclasses import replace

from homelab.bench.concurrency import FitCheck, FitVerdict
from homelab.errors import BenchError, PlanError
from homelab.gguf.model import ModelInfo
from homelab.planner.budget import Hardware, resolve_hardware
from homelab.planner.cache import pad, slot_settings_ctx
from homelab.planner.memory import estimate_memory
from homelab.planner.plan import Plan, plan_model
from homelab.planner.search import PlanRequest
from homelab.settings import Settings
from homelab.units import format_size, parse_size

TABLE_UBATCH = 512  # llama.cpp's default micro-batch


def parse_budget(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_size(text)
    except PlanError as error:
        raise BenchError(f"--budget: {error}") from error


def bench_hardware(budget_bytes: int | None) -> Hardware:
    """This machine as the planner sees it, with ``budget_bytes`` on the device the model uses."""
    hardware = resolve_hardware()
    if budget_bytes is None:
        return hardware
    target = hardware.gpus[0] if hardware.has_gpu else hardware.cpu
    budgeted = replace(
        target,
        budget_bytes=budget_bytes,
        budget_note=f"{format_size(budget_bytes)} given with --budget",
    )
    devices = tuple(budgeted if device is target else device for device in hardware.devices)
    return replace(hardware, devices=devices)


def profile_hardware_id(hardware: Hardware) -> str:
    """The id the planner looks measured profiles up by (GPU profile id / NVML name, or cpu)."""
    device = hardware.gpus[0] if hardware.has_gpu else hardware.cpu
    return device.hardware_id or device.label


def planned(info: ModelInfo, hardware: Hardware, min_ctx: int | None = None) -> Plan:
    """The plan ``homelab plan`` makes for exactly this weights file (its quant fixed); when
    that finds nothing (a small ``--budget``), the plan with at least ``min_ctx`` per slot."""
    try:
        return plan_model(info, hardware, PlanRequest(), verify=False)
    except PlanError as error:
        if min_ctx is None:
            raise _no_plan(info, error) from error
    try:
        return plan_model(info, hardware, PlanRequest(ctx=min_ctx), verify=False)
    except PlanError as error:
        raise _no_plan(info, error) from error


def _no_plan(info: ModelInfo, error: PlanError) -> BenchError:
    return BenchError(
        f"the planner finds no configuration of {info.name} that fits: {error}",
        hint="Give a larger --budget, or a smaller quant of the model.",
    )


def fit_check(info: ModelInfo, hardware: Hardware, n_ctx_per_request: int) -> FitCheck:
    """The planner's verdict on (K/V type, slots) at the fixed per-request context."""
    full_offload = info.n_layer + 1 if hardware.has_gpu else None

    def check(kv_type: str, concurrency: int) -> FitVerdict:
        request = PlanRequest(
            goal="throughput",
            ctx=n_ctx_per_request,
            parallel=concurrency,
            kv=(kv_type, kv_type),
            flash_attn=True,
            n_gpu_layers=full_offload,
            n_ubatch=TABLE_UBATCH,  # the same compute buffer for every cell: only K/V differs
        )
        try:
            plan = plan_model(info, hardware, request, verify=False)
        except PlanError as error:
            needed = _needed_bytes(info, hardware, kv_type, concurrency, n_ctx_per_request)
            return FitVerdict(False, None, needed, error.message)
        if not plan.fits:
            return FitVerdict(False, None, plan.memory.total_bytes, "over the budget")
        return FitVerdict(True, plan.settings, plan.memory.total_bytes)

    return check


def _needed_bytes(
    info: ModelInfo, hardware: Hardware, kv_type: str, concurrency: int, n_ctx_per_request: int
) -> int:
    """What the configuration the planner refused would take (for the table)."""
    settings = Settings(
        quant=info.file_type,
        n_ctx=slot_settings_ctx(n_ctx_per_request, concurrency),
        n_ctx_per_slot=pad(n_ctx_per_request),
        n_parallel=concurrency,
        type_k=kv_type,
        type_v=kv_type,
        flash_attn=True,
        n_gpu_layers=info.n_layer + 1 if hardware.has_gpu else 0,
        n_ubatch=TABLE_UBATCH,
    )
    return estimate_memory(info, settings, hardware).total_bytes
