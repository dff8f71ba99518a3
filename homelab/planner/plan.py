"""The plan: what was chosen, what it costs on each device, what each KV type would buy, how fast
it should run, whether llama.cpp confirmed it, and why.

:func:`plan_model` is the entry point the CLI, the TUI, bench and ``homelab.models`` call
with the ModelInfos to plan over (the planner never resolves a name itself). A :class:`Plan` is
frozen; ``to_dict()`` is the ``--json`` document (its top-level keys are a contract scripts rely
on: settings, memory, capacity, predicted, verified, fits, reasons).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from homelab.gguf.model import ModelInfo
from homelab.planner.budget import Hardware, resolve_hardware
from homelab.planner.dryrun import DryRunResult, dry_run
from homelab.planner.memory import MemoryEstimate, MemoryModel
from homelab.planner.predict import Prediction, predict_speed
from homelab.planner.rules import (
    DEFAULT_KV_PAIRS,
    KvPair,
    kv_label,
    kv_pair_problem,
    slow_pair_note,
)
from homelab.planner.search import (
    CAPACITY_LIMIT_TOKENS,
    Choice,
    PlanRequest,
    Search,
    order_by_quality,
)
from homelab.settings import Settings
from homelab.units import GIB, MIB, format_gib

LOG_RESOLUTION_MIB = 0.005  # llama.cpp logs sizes in MiB with two decimals


@dataclass(frozen=True)
class CapacityRow:
    """What one KV type buys with the chosen weights, slots and offload."""

    type_k: str
    type_v: str
    max_ctx: int  # per slot, up to the trained context; 0 when not even 256 tokens fit
    max_ctx_memory: int  # per slot, what memory alone allows (up to 1M tokens)
    chosen: bool
    note: str | None = None  # why the pair is not allowed, or that it is slow

    def to_dict(self) -> dict[str, object]:
        return {
            "type_k": self.type_k,
            "type_v": self.type_v,
            "max_ctx": self.max_ctx,
            "max_ctx_memory": self.max_ctx_memory,
            "chosen": self.chosen,
            "note": self.note,
        }


@dataclass(frozen=True)
class Comparison:
    """One planner figure next to llama.cpp's."""

    what: str
    predicted_bytes: int
    engine_bytes: int
    exact: bool  # equal at the log's resolution (0.01 MiB per logged line)

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_bytes - self.engine_bytes) / max(self.engine_bytes, 1)

    def to_dict(self) -> dict[str, object]:
        return {
            "what": self.what,
            "predicted_bytes": self.predicted_bytes,
            "engine_bytes": self.engine_bytes,
            "exact": self.exact,
            "error_pct": round(self.error_pct, 2),
        }


@dataclass(frozen=True)
class Verification:
    method: str  # "dry-run" or "formula"
    detail: str
    comparisons: tuple[Comparison, ...] = ()
    engine: DryRunResult | None = None

    @property
    def engine_verified(self) -> tuple[str, ...]:
        return tuple(c.what for c in self.comparisons)

    def to_dict(self) -> dict[str, object]:
        return {
            "method": self.method,
            "detail": self.detail,
            "engine_verified": list(self.engine_verified),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "engine_seconds": round(self.engine.seconds, 4) if self.engine else None,
        }


@dataclass(frozen=True)
class Plan:
    model_name: str
    model_source: str
    architecture: str
    trained_context: int
    full_offload_layers: int  # n_gpu_layers that puts every block and the output head on a GPU
    quants_considered: tuple[str, ...]
    goal: str
    hardware: Hardware
    settings: Settings
    memory: MemoryEstimate
    capacity: tuple[CapacityRow, ...]
    predicted: Prediction
    verified: Verification
    reasons: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": {
                "name": self.model_name,
                "source": self.model_source,
                "architecture": self.architecture,
                "quant": self.settings.quant,
                "trained_context": self.trained_context,
                "full_offload_layers": self.full_offload_layers,
                "quants_considered": list(self.quants_considered),
            },
            "goal": self.goal,
            "hardware": {
                "source": self.hardware.source,
                "devices": [_device_dict(d) for d in self.hardware.devices],
                "notes": list(self.hardware.notes),
            },
            "settings": self.settings.to_dict(),
            "memory": self.memory.to_dict(),
            "capacity": [row.to_dict() for row in self.capacity],
            "predicted": self.predicted.to_dict(),
            "verified": self.verified.to_dict(),
            "fits": self.fits,
            "reasons": list(self.reasons),
        }


def _device_dict(device: Any) -> dict[str, object]:
    return {
        "name": device.name,
        "kind": device.kind,
        "label": device.label,
        "total_bytes": device.total_bytes,
        "budget_bytes": device.budget_bytes,
        "budget_note": device.budget_note,
        "bandwidth_gb_s": device.bandwidth_gb_s,
        "overhead_bytes": device.overhead_bytes,
        "endpoint": device.endpoint,
    }


# --- entry points --------------------------------------------------------------------------


def plan_model(
    model: ModelInfo | Sequence[ModelInfo],
    hardware: Hardware | None = None,
    request: PlanRequest | None = None,
    verify: bool = True,
) -> Plan:
    """Plan ``model``: a ModelInfo, or its quant variants (what a
    ``homelab.models`` ref's ``variants()`` gives; the search applies ``request.quant``).

    ``hardware`` defaults to this machine as detected. With ``verify``, a plan for a local file
    is confirmed by a llama.cpp dry run; if llama.cpp's compute buffers turn out larger than the
    formula's and the plan no longer fits, the search runs again with them.
    """
    request = request or PlanRequest()
    variants = [model] if isinstance(model, ModelInfo) else list(model)
    hardware = hardware or resolve_hardware()
    search = Search(variants, hardware, request)
    result = search.run()
    choice, reasons = result.choice, list(result.reasons)
    verification = verify_choice(choice, hardware) if verify else _formula_only(choice, "not asked")
    if verification.engine is not None and verification.method == "dry-run":
        corrected = _with_engine_compute(choice, hardware, verification.engine)
        if not corrected.estimate.fits:
            reasons.append(
                "llama.cpp's compute buffers are larger than the formula's: re-planned with them"
            )
            search = Search([choice.model], hardware, request)
            search.candidates = [corrected.memory]
            result = search.run()
            choice, reasons = result.choice, [*reasons, *result.reasons]
            verification = verify_choice(choice, hardware)
        else:
            choice = corrected
    return build_plan(choice, hardware, request, verification, reasons, variants)


def build_plan(
    choice: Choice,
    hardware: Hardware,
    request: PlanRequest,
    verification: Verification,
    reasons: list[str],
    variants: Sequence[ModelInfo],
) -> Plan:
    model = choice.model
    capacity = capacity_rows(choice, hardware)
    all_reasons = [
        *explain(choice, hardware, request, variants),
        *reasons,
        *_verification_reasons(verification),
    ]
    return Plan(
        model_name=model.name,
        model_source=model.source,
        architecture=model.architecture,
        trained_context=model.context_length,
        full_offload_layers=choice.memory.full_offload_layers,
        quants_considered=tuple(m.file_type for m in order_by_quality(variants)),
        goal=request.goal,
        hardware=hardware,
        settings=choice.settings,
        memory=choice.estimate,
        capacity=capacity,
        predicted=predict_speed(choice.memory, choice.settings, hardware),
        verified=verification,
        reasons=tuple(all_reasons),
    )


# --- capacity ------------------------------------------------------------------------------


def capacity_rows(choice: Choice, hardware: Hardware) -> tuple[CapacityRow, ...]:
    """What each KV type buys for the chosen weights, slots, offload and batch."""
    chosen: KvPair = (choice.settings.type_k, choice.settings.type_v)
    pairs = list(DEFAULT_KV_PAIRS) + ([chosen] if chosen not in DEFAULT_KV_PAIRS else [])
    search = Search([choice.model], hardware, PlanRequest())
    search.candidates = [choice.memory]
    trained = max(choice.model.context_length, 256)
    rows = []
    for pair in pairs:
        flash = choice.settings.flash_attn or pair[1] not in ("f16", "bf16", "f32")
        problem = kv_pair_problem(choice.model, hardware, pair, flash)
        if problem:
            rows.append(CapacityRow(pair[0], pair[1], 0, 0, pair == chosen, problem))
            continue
        base = replace(choice.settings, type_k=pair[0], type_v=pair[1], flash_attn=flash)
        memory_max = search.max_ctx(choice.memory, base, CAPACITY_LIMIT_TOKENS)
        rows.append(
            CapacityRow(
                pair[0],
                pair[1],
                min(memory_max, trained),
                memory_max,
                pair == chosen,
                slow_pair_note(hardware, pair),
            )
        )
    return tuple(rows)


def capacity_table(
    model: ModelInfo, settings: Settings, hardware: Hardware
) -> tuple[CapacityRow, ...]:
    """The capacity table of ``model`` with ``settings`` (slots, offload, batch) on ``hardware``."""
    memory = MemoryModel(model)
    return capacity_rows(Choice(memory, settings, memory.estimate(settings, hardware)), hardware)


# --- verification --------------------------------------------------------------------------


def verify_choice(choice: Choice, hardware: Hardware) -> Verification:
    """Confirm a plan for a local file with a llama.cpp dry run; formula only otherwise."""
    source = Path(choice.model.source)
    if not source.is_file():
        return _formula_only(choice, "no local file to dry-run (catalogue model)")
    result = dry_run(source, choice.settings)
    if not result.ok:
        return Verification(
            "formula", f"the llama.cpp dry run failed: {result.error}", engine=result
        )
    return Verification(
        "dry-run", _dry_run_detail(result, hardware), compare(choice, result, hardware), result
    )


def _unverifiable_gpus(hardware: Hardware, result: DryRunResult) -> bool:
    """Whether the plan has local GPUs this (CPU-only) build could not size. RPC devices are
    sized by the dry run like local ones: the workers answer it."""
    local_gpus = [d for d in hardware.gpus if d.endpoint is None]
    return bool(local_gpus) and not result.gpu_offload


def _formula_only(choice: Choice, why: str) -> Verification:
    return Verification("formula", f"memory model only ({why})")


def _dry_run_detail(result: DryRunResult, hardware: Hardware) -> str:
    where = "this machine's llama.cpp build"
    if _unverifiable_gpus(hardware, result):
        return f"{where} is CPU-only: KV and recurrent totals confirmed, GPU compute buffers not"
    return f"{where} sized every buffer in {result.seconds * 1000:.0f} ms"


def compare(choice: Choice, result: DryRunResult, hardware: Hardware) -> tuple[Comparison, ...]:
    estimate = choice.estimate
    comparisons = []
    if result.kv_caches:
        tolerance = LOG_RESOLUTION_MIB * len(result.kv_caches) + 1e-9
        comparisons.append(_comparison("kv_bytes", estimate.kv_bytes, result.kv_mib, tolerance))
    if result.recurrent_mib is not None:
        comparisons.append(
            _comparison(
                "recurrent_bytes",
                estimate.recurrent_bytes,
                result.recurrent_mib,
                LOG_RESOLUTION_MIB,
            )
        )
    if _unverifiable_gpus(hardware, result):
        return tuple(comparisons)
    for device, mib in result.compute_mib.items():
        name = "CPU" if device in ("CPU", "CUDA_Host") else device
        if any(d.name == name for d in estimate.devices):
            predicted = estimate.device(name).compute_bytes
            comparisons.append(_comparison(f"compute_bytes {name}", predicted, mib, 0.0))
    return tuple(comparisons)


def _comparison(what: str, predicted: int, engine_mib: float, tolerance_mib: float) -> Comparison:
    exact = abs(predicted / MIB - engine_mib) <= tolerance_mib
    return Comparison(what, predicted, round(engine_mib * MIB), exact)


def _with_engine_compute(choice: Choice, hardware: Hardware, result: DryRunResult) -> Choice:
    """The choice with llama.cpp's compute buffers where they exceed the formula's."""
    if _unverifiable_gpus(hardware, result):
        return choice
    correction = {}
    for device, mib in result.compute_mib.items():
        name = "CPU" if device in ("CPU", "CUDA_Host") else device
        if not any(d.name == name for d in choice.estimate.devices):
            continue
        extra = round(mib * MIB) - choice.estimate.device(name).compute_bytes
        if extra > 0:
            correction[name] = extra
    if not correction:
        return choice
    memory = MemoryModel(choice.model, correction)
    return Choice(memory, choice.settings, memory.estimate(choice.settings, hardware))


def _verification_reasons(verification: Verification) -> list[str]:
    if verification.method != "dry-run":
        return [f"verified: {verification.detail}"]
    parts = []
    for c in verification.comparisons:
        state = "exact" if c.exact else f"{c.error_pct:+.1f}%"
        parts.append(f"{c.what} {state}")
    return [f"verified by a llama.cpp dry run: {', '.join(parts)}"]


# --- reasons -------------------------------------------------------------------------------


def explain(
    choice: Choice, hardware: Hardware, request: PlanRequest, variants: Sequence[ModelInfo]
) -> list[str]:
    """Why each knob has its value."""
    settings, memory = choice.settings, choice.memory
    partial = hardware.has_gpu and (
        settings.n_gpu_layers < memory.full_offload_layers or settings.n_cpu_moe > 0
    )
    reasons = [
        _quant_reason(settings, request, variants, partial),
        _kv_reason(settings, request, hardware),
    ]
    reasons.append(_offload_reason(choice, hardware, request))
    reasons.append(_flash_reason(settings, request, hardware, memory))
    reasons.append(_slots_reason(settings, request))
    if memory.geometry.has_swa:
        reasons.append(
            f"swa_full off: the {sum(memory.geometry.swa)} sliding-window layers keep only "
            f"{memory.model.n_swa} + n_ubatch cells (passed explicitly: llama-cpp-python's "
            "default is the full size)"
        )
    if settings.n_ubatch != 512:
        reasons.append(
            f"n_ubatch {settings.n_ubatch}: smaller compute buffers than 512 to make it fit"
        )
    if hardware.has_gpu:
        reasons.append(
            "GPU compute buffers and overhead are estimates (logits, attention and CUDA runtime) "
            "until a dry run on this GPU or a calibration measures them"
        )
    tight = choice.estimate.tightest
    reasons.append(
        f"tightest device: {tight.name} uses {tight.total_bytes / GIB:.2f} of "
        f"{format_gib(tight.budget_bytes)} budget"
    )
    return reasons


def _quant_reason(
    settings: Settings, request: PlanRequest, variants: Sequence[ModelInfo], partial: bool
) -> str:
    if request.quant is not None:
        return f"quant {settings.quant}: asked with --quant"
    names = [m.file_type for m in order_by_quality(variants)]
    if len(names) == 1:
        return f"quant {settings.quant}: the only file available"
    if partial:
        return (
            f"quant {settings.quant}: no quant fits on the GPU alone; the best one that keeps at "
            "least half the decode speed of the fastest partial offload"
        )
    better = names[: names.index(settings.quant)] if settings.quant in names else []
    if not better:
        return f"quant {settings.quant}: the best of {', '.join(names)}"
    return (
        f"quant {settings.quant}: {', '.join(better)} would not fit the minimum context on the GPU"
    )


def _kv_reason(settings: Settings, request: PlanRequest, hardware: Hardware) -> str:
    pair = (settings.type_k, settings.type_v)
    if request.kv is not None:
        return f"KV {kv_label(pair)}: asked with --kv"
    if pair == ("f16", "f16"):
        return "KV f16/f16: full precision reaches the goal, no need to quantize the cache"
    note = slow_pair_note(hardware, pair)
    cost = "a negligible" if pair[0] == "q8_0" else "a noticeable"
    return f"KV {kv_label(pair)}: buys context (or slots) f16 cannot, at {cost} quality cost" + (
        f"; {note}" if note else ""
    )


def _offload_reason(choice: Choice, hardware: Hardware, request: PlanRequest) -> str:
    settings = choice.settings
    full = choice.memory.full_offload_layers
    if not hardware.has_gpu:
        return "no GPU: everything runs on the CPU"
    if request.n_gpu_layers is not None:
        return f"{settings.n_gpu_layers} GPU layers: asked with --n-gpu-layers"
    if settings.n_gpu_layers >= full and settings.n_cpu_moe == 0:
        return (
            f"all {full} layers ({full - 1} blocks + output head) on the GPU: "
            "decode runs at GPU bandwidth"
        )
    if settings.n_cpu_moe:
        return f"experts of the first {settings.n_cpu_moe} blocks on the CPU, the rest on the GPU"
    on_cpu = full - settings.n_gpu_layers
    return f"{settings.n_gpu_layers} of {full} layers on the GPU, the first {on_cpu} on the CPU"


def _flash_reason(
    settings: Settings, request: PlanRequest, hardware: Hardware, memory: MemoryModel
) -> str:
    from homelab.planner.rules import flash_attn_problem

    if request.flash_attn is not None:
        return f"flash attention {'on' if settings.flash_attn else 'off'}: asked"
    problem = flash_attn_problem(memory.model, hardware)
    if problem:
        return f"flash attention off: {problem}, so V stays f16"
    return "flash attention on: smaller compute buffers, and required for a quantized V cache"


def _slots_reason(settings: Settings, request: PlanRequest) -> str:
    if request.parallel is not None:
        return f"{settings.n_parallel} slots: asked with --parallel"
    if settings.n_parallel == 1:
        return "1 slot: one request at a time gets the whole context (use --parallel for more)"
    return f"{settings.n_parallel} slots of {settings.n_ctx_per_slot} tokens"
