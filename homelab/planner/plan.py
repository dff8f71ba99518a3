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

from homelab.errors import PlanError
from homelab.gguf.model import ModelInfo
from homelab.planner.budget import Hardware, resolve_hardware
from homelab.planner.draft import VOCAB_SLACK, check_draft, draft_settings
from homelab.planner.dryrun import DryRunResult, dry_run
from homelab.planner.memory import MemoryEstimate, MemoryModel, draft_share
from homelab.planner.predict import Prediction, predict_speed
from homelab.planner.projector import (
    ProjectorCost,
    image_budget,
    projector_cost,
    projector_settings,
    with_budget,
)
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
from homelab.settings import UNQUANTIZED_KV_TYPES, Settings
from homelab.units import GIB, MIB, format_gib, format_size

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
    max_ctx_without_draft: int | None = None  # with --draft: what the pair buys without it

    def to_dict(self) -> dict[str, object]:
        return {
            "type_k": self.type_k,
            "type_v": self.type_v,
            "max_ctx": self.max_ctx,
            "max_ctx_memory": self.max_ctx_memory,
            "chosen": self.chosen,
            "note": self.note,
            "max_ctx_without_draft": self.max_ctx_without_draft,
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
    draft_engine: DryRunResult | None = None  # the draft's own dry run (with --draft)

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
    draft_name: str | None = None  # --draft: the speculative draft loaded beside the model
    draft_source: str | None = None
    draft_suggestion: str | None = None  # a local model that could draft (``--draft NAME``)
    projector: ProjectorCost | None = None  # the vision projector loaded with the model

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
            "draft": {"name": self.draft_name, "source": self.draft_source}
            if self.draft_name
            else None,
            "draft_suggestion": self.draft_suggestion,
            "projector": self.projector.to_dict() if self.projector else None,
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
    draft_candidates: Sequence[tuple[str, ModelInfo]] = (),
) -> Plan:
    """Plan ``model``: a ModelInfo, or its quant variants (what a
    ``homelab.models`` ref's ``variants()`` gives; the search applies ``request.quant``).

    ``hardware`` defaults to this machine as detected. With ``verify``, a plan for a local file
    is confirmed by a llama.cpp dry run; if llama.cpp's compute buffers turn out larger than the
    formula's and the plan no longer fits, the search runs again with them. With
    ``request.draft`` the draft is checked against the model and priced on the same devices;
    without it, ``draft_candidates`` (library name, ModelInfo) may yield a draft suggestion.
    """
    request = request or PlanRequest()
    variants = [model] if isinstance(model, ModelInfo) else list(model)
    hardware = hardware or resolve_hardware()
    if request.draft is not None:
        check_draft(variants[0], request.draft)
        request, draft_notes = with_draft_knobs(request, variants[0])
    else:
        draft_notes = []
    if request.projector is not None:
        return _plan_with_projector(variants, hardware, request, verify, draft_notes)
    plan = _plan(variants, hardware, request, verify, draft_notes)
    if request.draft is None and draft_candidates and plan.fits:
        return with_suggestion(plan, draft_candidates, hardware, request)
    return plan


def _plan_with_projector(
    variants: Sequence[ModelInfo],
    hardware: Hardware,
    request: PlanRequest,
    verify: bool,
    draft_notes: list[str],
) -> Plan:
    """The projector on the GPU unless told otherwise; when the plan cannot fit it there and
    its device was left open, on the CPU (said in the reasons)."""
    info = request.projector
    assert info is not None
    on_gpu = hardware.has_gpu and request.mmproj_offload is not False

    def placed(gpu: bool) -> PlanRequest:
        cost = projector_cost(
            info,
            on_gpu=gpu,
            image_max_tokens=request.image_max_tokens,
            measure=verify,
        )
        return replace(request, projector_cost=cost)

    if not on_gpu:
        return _plan(variants, hardware, placed(False), verify, draft_notes)
    gpu_request = placed(True)
    size = format_size(gpu_request.projector_cost.total_bytes if gpu_request.projector_cost else 0)
    offer = (
        f"The vision projector ({size}) does not fit on the GPU with this model; "
        "--mmproj-cpu puts it on the CPU (slower image encoding), --no-mmproj leaves it out."
    )
    try:
        plan = _plan(variants, hardware, gpu_request, verify, draft_notes)
    except PlanError as error:
        if request.mmproj_offload:
            raise PlanError(error.message, hint=offer) from None
        plan = None
    if plan is not None and (plan.fits or request.mmproj_offload):
        return plan if plan.fits else replace(plan, reasons=(*plan.reasons, offer))
    on_cpu = _plan(variants, hardware, placed(False), verify, draft_notes)
    note = f"the vision projector ({size}) goes on the CPU: on the GPU it does not fit"
    return replace(on_cpu, reasons=(*on_cpu.reasons, note))


def _plan(
    variants: Sequence[ModelInfo],
    hardware: Hardware,
    request: PlanRequest,
    verify: bool,
    draft_notes: list[str],
) -> Plan:
    search = Search(list(variants), hardware, request)
    result = search.run()
    choice, reasons = result.choice, list(result.reasons)
    verification = verify_choice(choice, hardware) if verify else _formula_only(choice, "not asked")
    if verification.engine is not None and verification.method == "dry-run":
        corrected = _with_engine_compute(
            choice, hardware, verification.engine, verification.draft_engine
        )
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
    reasons = [*draft_notes, *reasons]
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
    projector = _final_projector(request, choice.settings.n_ctx_per_slot)
    budget_note = _image_budget_note(request, projector)
    if projector != choice.memory.projector:  # a smaller image budget: a smaller buffer
        memory = choice.memory.with_projector(projector)
        choice = Choice(memory, choice.settings, memory.estimate(choice.settings, hardware))
    all_reasons = [
        *explain(choice, hardware, request, variants),
        *draft_reasons(choice),
        *reasons,
        *_verification_reasons(verification),
        *budget_note,
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
        settings=projector_settings(choice.settings, projector),
        memory=choice.estimate,
        capacity=capacity,
        predicted=predict_speed(choice.memory, choice.settings, hardware),
        verified=verification,
        reasons=tuple(all_reasons),
        draft_name=request.draft.name if request.draft else None,
        draft_source=request.draft.source if request.draft else None,
        projector=projector,
    )


def _image_budget_note(request: PlanRequest, projector: ProjectorCost | None) -> list[str]:
    """Why images are held below the projector's own maximum (mtmd scales them down)."""
    most = request.projector.max_image_tokens() if request.projector else None
    if projector is None or most is None or projector.image_max_tokens in (None, most):
        return []
    why = (
        "as asked" if request.image_max_tokens else "half a slot's context, to leave room for text"
    )
    return [
        f"images up to {projector.image_max_tokens} tokens ({why}; the projector allows {most}, "
        "larger images are scaled down — --image-max-tokens N sets it)"
    ]


def _final_projector(request: PlanRequest, n_ctx_per_slot: int) -> ProjectorCost | None:
    """The placed projector with the per-image budget the chosen slot context leaves (the
    search priced the projector's maximum, an upper bound; this is what mtmd will reserve)."""
    cost, info = request.projector_cost, request.projector
    if cost is None or info is None:
        return cost
    return with_budget(cost, info, image_budget(info, request.image_max_tokens, n_ctx_per_slot))


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
        flash = choice.settings.flash_attn or pair[1] not in UNQUANTIZED_KV_TYPES
        problem = kv_pair_problem(choice.model, hardware, pair, flash)
        if problem:
            rows.append(CapacityRow(pair[0], pair[1], 0, 0, pair == chosen, problem))
            continue
        base = replace(choice.settings, type_k=pair[0], type_v=pair[1], flash_attn=flash)
        memory_max = search.max_ctx(choice.memory, base, CAPACITY_LIMIT_TOKENS)
        without = None
        if choice.memory.draft is not None:
            alone = choice.memory.without_draft()
            without = min(search.max_ctx(alone, base, CAPACITY_LIMIT_TOKENS), trained)
        rows.append(
            CapacityRow(
                pair[0],
                pair[1],
                min(memory_max, trained),
                memory_max,
                pair == chosen,
                slow_pair_note(hardware, pair),
                without,
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
    comparisons = compare(choice.estimate, result, hardware)
    draft_result = _draft_dry_run(choice)
    if draft_result is not None and draft_result.ok and choice.estimate.draft is not None:
        comparisons += compare(choice.estimate.draft, draft_result, hardware, "draft ")
    detail = _dry_run_detail(result, hardware)
    if draft_result is not None and not draft_result.ok:
        detail += f"; the draft's dry run failed: {draft_result.error}"
    return Verification("dry-run", detail, comparisons, result, draft_result)


def _draft_dry_run(choice: Choice) -> DryRunResult | None:
    draft = choice.memory.draft
    if draft is None or not Path(draft.model.source).is_file():
        return None
    return dry_run(draft.model.source, draft_settings(choice.settings, draft.model))


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


def compare(
    estimate: MemoryEstimate, result: DryRunResult, hardware: Hardware, prefix: str = ""
) -> tuple[Comparison, ...]:
    """The estimate's KV, recurrent and compute figures next to the dry run's."""
    comparisons = []
    if result.kv_caches:
        tolerance = LOG_RESOLUTION_MIB * len(result.kv_caches) + 1e-9
        comparisons.append(
            _comparison(f"{prefix}kv_bytes", estimate.kv_bytes, result.kv_mib, tolerance)
        )
    if result.recurrent_mib is not None:
        comparisons.append(
            _comparison(
                f"{prefix}recurrent_bytes",
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
            comparisons.append(_comparison(f"{prefix}compute_bytes {name}", predicted, mib, 0.0))
    return tuple(comparisons)


def _comparison(what: str, predicted: int, engine_mib: float, tolerance_mib: float) -> Comparison:
    exact = abs(predicted / MIB - engine_mib) <= tolerance_mib
    return Comparison(what, predicted, round(engine_mib * MIB), exact)


def _with_engine_compute(
    choice: Choice,
    hardware: Hardware,
    result: DryRunResult,
    draft_result: DryRunResult | None = None,
) -> Choice:
    """The choice with llama.cpp's compute buffers where they exceed the formula's (the
    draft's too, when its dry run measured them)."""
    if _unverifiable_gpus(hardware, result):
        return choice
    correction = _compute_correction(choice.estimate, result)
    draft = choice.memory.draft
    if draft is not None and draft_result is not None and draft_result.ok:
        assert choice.estimate.draft is not None
        draft_correction = _compute_correction(choice.estimate.draft, draft_result)
        if draft_correction:
            draft = MemoryModel(draft.model, draft_correction)
    if not correction and draft is choice.memory.draft:
        return choice
    memory = MemoryModel(choice.model, correction, draft=draft, projector=choice.memory.projector)
    return Choice(memory, choice.settings, memory.estimate(choice.settings, hardware))


def _compute_correction(estimate: MemoryEstimate, result: DryRunResult) -> dict[str, int]:
    correction = {}
    for device, mib in result.compute_mib.items():
        name = "CPU" if device in ("CPU", "CUDA_Host") else device
        if not any(d.name == name for d in estimate.devices):
            continue
        extra = round(mib * MIB) - estimate.device(name).compute_bytes
        if extra > 0:
            correction[name] = extra
    return correction


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
    from homelab.planner.rules import all_layers_on_cpu, flash_attn_problem

    if request.flash_attn is not None:
        return f"flash attention {'on' if settings.flash_attn else 'off'}: asked"
    if all_layers_on_cpu(hardware, request.n_gpu_layers):
        if settings.flash_attn:
            return "flash attention on: the quantized V cache needs it"
        return (
            "flash attention off: every layer is on the CPU, where llama.cpp's kernel decodes "
            "at 0.4-0.6x the speed once the context fills (--flash-attn reads prompts ~1.2x "
            "faster)"
        )
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


# --- the speculative draft -----------------------------------------------------------------

DRAFT_SHARE_OF_TARGET = 0.25  # a suggested draft has at most this share of the target's params


def with_draft_knobs(request: PlanRequest, target: ModelInfo) -> tuple[PlanRequest, list[str]]:
    """The knobs a draft needs: a full sliding-window cache (rejected tokens roll back)."""
    if not target.has_swa or request.swa_full:
        return request, []
    note = (
        "swa_full on: speculative decoding rolls back rejected draft tokens, which a trimmed "
        "sliding-window cache cannot"
    )
    return replace(request, swa_full=True), [note]


def draft_reasons(choice: Choice) -> list[str]:
    """What the draft costs and where it lives."""
    draft = choice.estimate.draft
    if draft is None or choice.memory.draft is None:
        return []
    model = choice.memory.draft.model
    s = choice.settings
    where = ", ".join(
        f"{d.name} {format_size(d.draft_bytes)}" for d in choice.estimate.devices if d.draft_bytes
    )
    return [
        f"draft {model.name} {model.file_type}: weights {format_size(draft.weights_bytes)}, "
        f"KV {format_size(draft.kv_bytes)} ({s.n_parallel} slot(s) × {s.n_ctx_per_slot} tokens, "
        f"{s.type_k}/{s.type_v}, the target's slot layout), compute "
        f"{format_size(draft.compute_bytes)}, logits {format_size(draft.overhead_bytes)}; "
        f"on {where}"
    ]


def with_suggestion(
    plan: Plan,
    candidates: Sequence[tuple[str, ModelInfo]],
    hardware: Hardware,
    request: PlanRequest,
) -> Plan:
    """The plan with a draft suggestion from ``candidates`` (library name, ModelInfo): a
    smaller local model with the same vocabulary whose cost fits in what the plan leaves."""
    target = _chosen_variant(plan)
    if target is None or target.is_recurrent:
        return plan
    options = []
    for name, info in candidates:
        cost = _draft_cost_if_it_fits(plan, target, info, hardware)
        if cost is not None:
            options.append((info.n_params, name, cost))
    if not options:
        return plan
    small = [o for o in options if o[0] <= DRAFT_SHARE_OF_TARGET * target.n_params]
    _, name, cost = max(small) if small else min(options)
    text = f"draft suggestion: --draft {name} (same vocabulary, +{format_size(cost)})"
    return replace(plan, draft_suggestion=text, reasons=(*plan.reasons, text))


def _chosen_variant(plan: Plan) -> ModelInfo | None:
    from homelab.gguf.reader import read_model

    source = Path(plan.model_source)
    if not source.is_file():
        return None
    return read_model(source)


def _draft_cost_if_it_fits(
    plan: Plan, target: ModelInfo, draft: ModelInfo, hardware: Hardware
) -> int | None:
    """The bytes ``draft`` would add to ``plan``; None when it cannot draft or does not fit."""
    if draft.n_params >= target.n_params or Path(draft.source) == Path(target.source):
        return None
    if not Path(draft.source).is_file() or draft.tokenizer_model != target.tokenizer_model:
        return None
    if abs(draft.n_vocab - target.n_vocab) > VOCAB_SLACK:
        return None  # cheap checks first: only plausible drafts read their token lists
    try:
        check_draft(target, draft)
    except PlanError:
        return None
    settings = draft_settings(plan.settings, draft)
    estimate = MemoryModel(draft).estimate(settings, hardware)
    total = 0
    for mine, theirs in zip(plan.memory.devices, estimate.devices, strict=True):
        share = draft_share(theirs)
        if share > mine.headroom_bytes:
            return None
        total += share
    return total
