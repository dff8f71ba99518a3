"""Loading a model and its context through llama.cpp's low-level API, with an OOM ladder.

``load_model`` applies a :class:`~homelab.settings.Settings` exactly (n_gpu_layers,
MoE expert overrides, mmap, n_ctx, n_seq_max = slots, K/V types, flash attention,
n_batch/n_ubatch, swa_full, kv_unified, threads). When llama.cpp fails *for memory* it steps
down one rung at a time and retries:

    1. context    halve the total context (twice at most, never below 512 per slot)
    2. kv-type    quantize the K/V cache (q8_0, then q4_0; flash attention on)
    3. experts    keep every MoE expert tensor on the CPU
    4. gpu-layers halve the offloaded layers until none are left

Every attempt is recorded in a :class:`LoadReport` (which rung worked, and why each earlier
one failed), together with the buffer sizes llama.cpp logged, so the TUI and the calibration
record can show what was really allocated. A failure that is not about memory (a bad file, an
impossible K/V type) is reported at once: stepping down would not help.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from homelab.errors import EngineError, ModelFileError, OutOfMemoryError
from homelab.gguf.model import ModelInfo
from homelab.llamacpp.context import Context, ContextCreateError, ContextParams
from homelab.llamacpp.model import Model, ModelLoadError, ModelParams
from homelab.llamacpp.mtmd import Projector, ProjectorParams
from homelab.settings import COMPARED_KV_TYPES, QUANTIZED_KV_TYPES, Settings
from homelab.units import MIB

MIN_CTX_PER_SLOT = 512
MAX_CONTEXT_HALVINGS = 2

_BUFFER_LINE = re.compile(
    r"(?P<device>[\w.:\[\]-]+)\s+(?P<kind>model|KV|RS|compute|output) buffer size =\s*"
    r"(?P<mib>[\d.]+) MiB"
)


@dataclass(frozen=True)
class BufferSizes:
    """Bytes per device that llama.cpp reported allocating, by buffer kind."""

    model: dict[str, int] = field(default_factory=dict)  # e.g. {"CPU_Mapped": ..., "CUDA0": ...}
    kv: dict[str, int] = field(default_factory=dict)  # K/V cache (all caches of the context)
    recurrent: dict[str, int] = field(default_factory=dict)  # recurrent state (Mamba, RWKV)
    compute: dict[str, int] = field(default_factory=dict)
    output: dict[str, int] = field(default_factory=dict)

    def total_bytes(self) -> int:
        kinds = (self.model, self.kv, self.recurrent, self.compute, self.output)
        return sum(sum(kind.values()) for kind in kinds)


@dataclass(frozen=True)
class LadderStep:
    """One load attempt: which rung, with what settings, and how it went."""

    rung: str  # "as planned", "context", "kv-type", "experts", "gpu-layers"
    settings: Settings
    ok: bool
    reason: str  # why this rung was tried, or why it failed


@dataclass(frozen=True)
class LoadReport:
    """What loading did: the settings in use, the ladder steps, and llama.cpp's buffers."""

    model_path: str
    planned: Settings
    settings: Settings  # what is actually loaded
    steps: tuple[LadderStep, ...]
    buffers: BufferSizes
    n_ctx: int  # total context cells llama.cpp created
    n_ctx_per_slot: int
    n_slots: int
    prefix_reuse: bool
    prefix_reuse_note: str
    load_s: float
    rss_before_bytes: int
    rss_after_bytes: int

    @property
    def succeeded_rung(self) -> str:
        return self.steps[-1].rung

    @property
    def stepped_down(self) -> bool:
        return len(self.steps) > 1

    def summary(self) -> str:
        if not self.stepped_down:
            return "loaded as planned"
        failures = "; ".join(f"{s.rung}: {s.reason}" for s in self.steps[:-1])
        return f"loaded after stepping down to '{self.succeeded_rung}' ({failures})"


@dataclass
class LoadedModel:
    """Owns the llama.cpp model and its context; free both with :meth:`close`."""

    model: Model
    context: Context
    report: LoadReport
    projector: Projector | None = None  # the vision projector (Settings.mmproj_path)

    def close(self) -> None:
        if self.projector is not None:
            self.projector.close()  # made for the model: freed before it
        self.context.close()  # before the model it belongs to
        self.model.close()


# --- parameters --------------------------------------------------------------------------


def context_params(settings: Settings) -> ContextParams:
    """The plan's context, with llama.cpp tools' thread default when the plan leaves it."""
    return ContextParams.from_settings(settings).with_threads(
        settings.n_threads or default_threads()
    )


def default_threads() -> int:
    """llama.cpp tools' default: one thread per physical core we may run on."""
    import os

    import psutil

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    physical = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    return max(1, min(physical, usable or physical))


# --- one attempt -------------------------------------------------------------------------


def _load_once(path: Path, settings: Settings) -> tuple[LoadedModel, str]:
    model = Model.load(path, ModelParams.from_settings(settings))
    try:
        context = Context.create(model, context_params(settings))
    except BaseException:
        model.close()
        raise
    placeholder = _placeholder_report(path, settings)
    return LoadedModel(model, context, placeholder), model.load_log + context.creation_log


def _placeholder_report(path: Path, settings: Settings) -> LoadReport:
    return LoadReport(
        str(path), settings, settings, (), BufferSizes(), 0, 0, 0, True, "", 0.0, 0, 0
    )


def parse_buffers(log_text: str) -> BufferSizes:
    """Sum llama.cpp's ``<device> <kind> buffer size = N MiB`` lines per kind and device."""
    sizes = BufferSizes()
    kinds = {"model": sizes.model, "KV": sizes.kv, "RS": sizes.recurrent}
    kinds |= {"compute": sizes.compute, "output": sizes.output}
    for match in _BUFFER_LINE.finditer(log_text):
        table = kinds[match["kind"]]
        device = match["device"]
        table[device] = table.get(device, 0) + round(float(match["mib"]) * MIB)
    return sizes


# --- the ladder --------------------------------------------------------------------------

Rung = tuple[str, Settings, str]


def _with_context(settings: Settings, n_ctx_per_slot: int) -> Settings:
    return replace(
        settings, n_ctx=n_ctx_per_slot * settings.n_parallel, n_ctx_per_slot=n_ctx_per_slot
    )


def _context_rungs(settings: Settings) -> Iterator[Rung]:
    per_slot = settings.n_ctx_per_slot
    for _ in range(MAX_CONTEXT_HALVINGS):
        if per_slot // 2 < MIN_CTX_PER_SLOT:
            return
        per_slot //= 2
        yield "context", _with_context(settings, per_slot), f"context per slot → {per_slot}"


def _kv_rungs(settings: Settings) -> Iterator[Rung]:
    """Smaller caches: the quantized ones of the compared K/V types, largest first."""
    for kv_type in (t for t in COMPARED_KV_TYPES if t in QUANTIZED_KV_TYPES):
        current = max(_kv_rank(settings.type_k), _kv_rank(settings.type_v))
        if _kv_rank(kv_type) <= current:
            continue
        changed = replace(settings, type_k=kv_type, type_v=kv_type, flash_attn=True)
        yield "kv-type", changed, f"K/V cache → {kv_type} (flash attention on)"


def _kv_rank(kv_type: str) -> int:
    """Higher = smaller cache."""
    order = {"f32": 0, "f16": 1, "bf16": 1, "q8_0": 2, "q5_1": 3, "q5_0": 3}
    return order.get(kv_type, 4)


def _offload_rungs(settings: Settings, n_layer: int, n_expert: int) -> Iterator[Rung]:
    current = settings
    if n_expert and settings.n_gpu_layers != 0 and settings.n_cpu_moe < n_layer:
        current = replace(current, n_cpu_moe=n_layer)
        yield "experts", current, "every MoE expert on the CPU"
    layers = settings.n_gpu_layers if settings.n_gpu_layers >= 0 else n_layer + 1
    while layers > 0:
        layers //= 2
        current = replace(current, n_gpu_layers=layers)
        yield "gpu-layers", current, f"GPU layers → {layers}"


def ladder(settings: Settings, info: ModelInfo | None) -> Iterator[Rung]:
    """The rungs to try, in order; each rung builds on the last one that was yielded."""
    yield "as planned", settings, "the plan's settings"
    current = settings
    generators: list[Callable[[Settings], Iterator[Rung]]] = [_context_rungs, _kv_rungs]
    n_layer = info.n_layer if info else 0
    n_expert = info.n_expert if info else 0
    generators.append(lambda s: _offload_rungs(s, n_layer, n_expert))
    for make in generators:
        for rung, changed, reason in make(current):
            current = changed
            yield rung, changed, reason


# --- public ------------------------------------------------------------------------------


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def load_model(
    model_path: str | Path,
    settings: Settings,
    *,
    info: ModelInfo | None = None,
    oom_ladder: bool = True,
) -> LoadedModel:
    """Load ``model_path`` with ``settings``; on memory failures step down the ladder."""
    path = Path(model_path).expanduser()
    if not path.is_file():
        raise ModelFileError(path, "file not found", hint="Check the path or run `homelab models`.")
    rss_before = _rss_bytes()
    started = time.perf_counter()
    steps: list[LadderStep] = []
    for rung, candidate, reason in ladder(settings, info):
        try:
            loaded, log_text = _load_once(path, candidate)
        except (ModelLoadError, ContextCreateError) as failure:
            steps.append(LadderStep(rung, candidate, False, failure.reason))
            if not failure.for_memory:
                raise _not_memory_error(path, failure) from None
            if not oom_ladder:
                raise _memory_error(path, steps) from None
            continue
        steps.append(LadderStep(rung, candidate, True, reason))
        _attach_projector(loaded, candidate)  # its log: loaded.projector.creation_log
        loaded.report = _report(path, settings, candidate, steps, loaded, log_text)
        loaded.report = replace(
            loaded.report,
            load_s=time.perf_counter() - started,
            rss_before_bytes=rss_before,
            rss_after_bytes=_rss_bytes(),
        )
        return loaded
    raise _memory_error(path, steps)


def projector_params(settings: Settings) -> ProjectorParams:
    """How the plan's settings load a vision projector."""
    return ProjectorParams(
        use_gpu=settings.mmproj_offload,
        n_threads=settings.n_threads or default_threads(),
        image_max_tokens=settings.image_max_tokens,
    )


def _attach_projector(loaded: LoadedModel, settings: Settings) -> None:
    """Load ``settings.mmproj_path`` for the loaded model (nothing when it is empty); a
    failure frees the model and context and says what to do."""
    if not settings.mmproj_path:
        return
    try:
        loaded.projector = Projector.load(
            settings.mmproj_path, loaded.model, projector_params(settings)
        )
    except BaseException:
        loaded.close()
        raise


def _report(
    path: Path,
    planned: Settings,
    used: Settings,
    steps: list[LadderStep],
    loaded: LoadedModel,
    log_text: str,
) -> LoadReport:
    recurrent = loaded.model.keeps_recurrent_state
    note = (
        "prefix reuse disabled: llama.cpp cannot drop part of a recurrent state, "
        "so every request clears its slot and evaluates its whole prompt"
        if recurrent
        else "prefix reuse on (per tenant)"
    )
    return LoadReport(
        model_path=str(path),
        planned=planned,
        settings=used,
        steps=tuple(steps),
        buffers=parse_buffers(log_text),
        n_ctx=loaded.context.n_ctx,
        n_ctx_per_slot=loaded.context.n_ctx_per_seq,
        n_slots=loaded.context.n_seq_max,
        prefix_reuse=not recurrent,
        prefix_reuse_note=note,
        load_s=0.0,
        rss_before_bytes=0,
        rss_after_bytes=0,
    )


def _not_memory_error(path: Path, failure: ModelLoadError | ContextCreateError) -> EngineError:
    what = "load the model" if isinstance(failure, ModelLoadError) else "create the context"
    return EngineError(
        f"llama.cpp could not {what} from {path}: {failure.reason}",
        hint="Check that the file is a complete GGUF and that the K/V types and flash "
        "attention setting suit this model (quantized V needs flash attention and head "
        "sizes divisible by 32).",
    )


def _memory_error(path: Path, steps: list[LadderStep]) -> OutOfMemoryError:
    tried = "; ".join(f"{s.rung}: {s.reason}" for s in steps)
    return OutOfMemoryError(
        f"not enough memory to load {path.name} (tried {tried})",
        hint="Choose a smaller quant or context, or free memory used by other programs.",
    )
