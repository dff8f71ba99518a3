"""What ``homelab quality`` measures: what the plan's K/V cache (and weights) cost in quality.

The plan (as ``homelab plan`` would choose it for this weights file) and the same weights with
each K/V type are compared with a reference — the most precise weights file of the model
found next to it (or the one given), with an f16 cache — on a text: KL divergence of the
next-token distributions (mean, p99, max), top-1 agreement and perplexity. The result is saved
for the dashboard, which shows it next to the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from homelab.errors import BenchError
from homelab.settings import COMPARED_KV_TYPES

if TYPE_CHECKING:
    from homelab.bench.quality import Progress, QualityResult
    from homelab.gguf.model import ModelInfo
    from homelab.planner.budget import Hardware

MIN_CTX = 16


@dataclass(frozen=True)
class QualityOptions:
    """The ``homelab quality`` flags."""

    text: Path | None = None  # None: the trained demo's held-out text, else the bundled essay
    n_ctx: int = 512  # tokens per chunk
    max_chunks: int | None = None
    kv_types: tuple[str, ...] = COMPARED_KV_TYPES
    reference: Path | None = None  # None: the most precise file beside the model
    budget_bytes: int | None = None
    save: bool = True


def unusable_kv_types(
    info: ModelInfo, hardware: Hardware, kv_types: tuple[str, ...]
) -> dict[str, str]:
    """K/V types llama.cpp would refuse for this model (e.g. q8_0 with 48-wide heads), each
    with the note that says why it is not measured."""
    from homelab.planner.rules import kv_pair_problem

    problems = {kv: kv_pair_problem(info, hardware, (kv, kv), True) for kv in kv_types}
    return {kv: f"K/V {kv} not measured: {why}." for kv, why in problems.items() if why}


def measure_plan_quality(
    path: Path, options: QualityOptions, progress: Progress | None = None
) -> tuple[QualityResult, str | None]:
    """The quality cost of the plan for ``path``, and where the result was saved (or None)."""
    from homelab.bench import planning, quality, store, weights
    from homelab.gguf.demo import held_out_text
    from homelab.gguf.reader import read_model
    from homelab.lock import refuse_if_server_running

    refuse_if_server_running("quality run")
    info = read_model(path)
    hardware = planning.bench_hardware(options.budget_bytes)
    settings = planning.planned(info, hardware).settings
    skipped = unusable_kv_types(info, hardware, options.kv_types)
    reference = (
        weights.describe(options.reference) if options.reference else weights.most_precise(path)
    )
    comparison = quality.plan_comparison(
        str(path.resolve()),
        settings.quant,
        settings.type_k,
        settings.type_v,
        settings.flash_attn,
        reference_path=str(reference.path),
        reference_quant=reference.quant,
        kv_types=[kv for kv in options.kv_types if kv not in skipped],
    )
    if options.n_ctx < MIN_CTX:
        raise BenchError(
            f"--ctx {options.n_ctx} is too small", hint=f"Use at least {MIN_CTX} (512 is usual)."
        )
    text, source = quality.read_text(options.text or held_out_text(path))
    result = quality.measure_quality(
        comparison.reference,
        comparison.candidates,
        text,
        model_name=info.name,
        text_source=source,
        plan_key=comparison.plan_key,
        n_ctx=options.n_ctx,
        max_chunks=options.max_chunks,
        progress=progress,
    )
    result = replace(
        result,
        measured_at=store.now_iso(),
        hardware_id=planning.profile_hardware_id(hardware),
        notes=comparison.notes + tuple(skipped.values()),
    )
    saved = str(store.save_quality(result)) if options.save else None
    return result, saved
