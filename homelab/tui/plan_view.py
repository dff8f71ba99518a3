"""A :class:`~homelab.planner.plan.Plan` turned into what the plan panel shows.

Textual-free: markup strings, bar segments and a Rich table, so it is testable alone. After a
load, each device also shows what llama.cpp really allocated next to the prediction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from homelab.tui.bars import LIGHT_SHADE, Segment
from homelab.tui.format import human_tokens
from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.engine.loader import LoadReport
    from homelab.planner.memory import DeviceMemory
    from homelab.planner.plan import CapacityRow, Plan

# One colour per memory component, in stacking order (weights, KV, recurrent, compute, overhead).
PART_STYLES = {
    "weights": "#5f87d7",
    "KV": "#af87ff",
    "recurrent": "#d787af",
    "compute": "#d7af5f",
    "overhead": "#808080",
    "draft": "#87af87",  # the speculative draft's weights, KV, compute and logits
    "projector": "#5fafaf",  # the vision projector's weights and warm-up buffer
}
FREE_STYLE = "#4e4e4e"
OVER_STYLE = "bold red"
# llama.cpp's buffer names that live in host memory
HOST_BUFFERS = ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host")


@dataclass(frozen=True)
class DeviceView:
    title: str
    segments: list[Segment]
    legend: str


@dataclass(frozen=True)
class PlanView:
    verdict: str
    settings_line: str
    devices: list[DeviceView] = field(default_factory=list)
    capacity_rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    reasons: str = ""
    quality: str = ""  # the last `homelab quality` result for this model, if any

    @property
    def capacity(self) -> Table:
        """Context reachable per slot with each KV type (the chosen one in bold)."""
        table = Table(box=None, padding=(0, 2, 0, 0), show_edge=False, header_style="bold")
        table.add_column("KV K/V")
        table.add_column("max context", justify="right")
        table.add_column("memory allows", justify="right")
        table.add_column("", overflow="fold")
        for cells in self.capacity_rows:
            table.add_row(*cells, style="bold" if "chosen" in cells[3] else "")
        return table


def plan_view(plan: Plan, load_report: LoadReport | None = None) -> PlanView:
    """What the panel shows for ``plan``; ``load_report`` (after a load) adds actual sizes."""
    actual = actual_by_device(load_report) if load_report is not None else None
    return PlanView(
        verdict=verdict(plan),
        settings_line=settings_line(plan),
        devices=[device_view(d, actual) for d in reversed(plan.memory.devices)],  # GPUs first
        capacity_rows=[capacity_cells(row) for row in plan.capacity],
        reasons="\n".join(f"• {escape(reason)}" for reason in plan.reasons),
        quality=quality_line(plan.model_name),
    )


def quality_line(model_name: str) -> str:
    """The last measured quality cost of this model (``homelab quality``), or ""."""
    from homelab.bench.store import load_last_quality

    result = load_last_quality(model_name)
    if result is None:
        return ""
    return f"[b]Measured quality[/b] {escape(result.summary())}"


def verdict(plan: Plan) -> str:
    where = ", ".join(escape(d.label) for d in plan.hardware.gpus) or "the CPU"
    speed = plan.predicted
    predicted = (
        f"[dim]predicted {speed.decode_tok_s:,.0f} tok/s decode, "
        f"{speed.prefill_tok_s:,.0f} prefill ({speed.basis})[/]"
    )
    if plan.fits:
        return f"[b $success]✔ fits[/] on {where} · {predicted}"
    tight = plan.memory.tightest
    short = format_size(tight.total_bytes - tight.budget_bytes, digits=1)
    return (
        f"[b $error]✘ does not fit[/]: {tight.name} is {short} over its budget. "
        "Lower the context, quantize the KV cache, or pick a smaller quant."
    )


def settings_line(plan: Plan) -> str:
    s = plan.settings
    full = plan.full_offload_layers
    if plan.hardware.has_gpu:
        offload = f"GPU layers {min(s.n_gpu_layers, full)}/{full}"
        offload += f" · experts on CPU: {s.n_cpu_moe} blocks" if s.n_cpu_moe else ""
    else:
        offload = "CPU only"
    slots = "slot" if s.n_parallel == 1 else "slots"
    return (
        f"[b]{s.quant}[/b] · KV [b]{s.type_k}/{s.type_v}[/b] · "
        f"context [b]{s.n_ctx_per_slot:,}[/b] × {s.n_parallel} {slots} · "
        f"{offload} · flash attn {'on' if s.flash_attn else 'off'}" + vision_text(plan)
    )


def vision_text(plan: Plan) -> str:
    """`` · vision on CPU 60 MiB · images ≤ 4096 tokens`` (nothing without a projector)."""
    projector = plan.projector
    if projector is None:
        return ""
    where = "GPU" if projector.on_gpu else "CPU"
    size = format_size(projector.total_bytes, digits=1)
    tokens = projector.image_max_tokens
    each = "=" if projector.fixed_tokens else "≤"
    images = f" · images {each} {tokens} tokens" if tokens else ""
    return f" · vision on {where} {size}{images}"


def device_segments(device: DeviceMemory) -> list[Segment]:
    segments = [
        Segment(part.label, part.size_bytes, PART_STYLES[part.label]) for part in device.parts()
    ]
    if device.fits:
        segments.append(Segment("free", device.headroom_bytes, FREE_STYLE, LIGHT_SHADE))
    else:
        segments.append(Segment("over", 0, OVER_STYLE))
    return segments


def device_view(device: DeviceMemory, actual: Mapping[str, Mapping[str, int]] | None) -> DeviceView:
    used = 100 * device.total_bytes / max(device.budget_bytes, 1)
    over = "" if device.fits else " [b red]over budget[/]"
    total, budget = format_size(device.total_bytes, 1), format_size(device.budget_bytes, 1)
    usage = f"{total} of {budget}"
    title = f"[b]{escape(device.name)}[/b] {escape(device.label)} · {usage} ({used:.0f}%){over}"
    return DeviceView(title, device_segments(device), legend(device, actual))


def legend(device: DeviceMemory, actual: Mapping[str, Mapping[str, int]] | None) -> str:
    values = {part.label: part.size_bytes for part in device.parts()}
    shown = [
        f"[{PART_STYLES[name]}]■[/] {name} {format_size(value, digits=1)}"
        for name, value in values.items()
        if value or name in ("weights", "KV")
    ]
    if device.fits:
        shown.append(f"[{FREE_STYLE}]░[/] free {format_size(device.headroom_bytes, digits=1)}")
    text = "  ".join(shown)
    measured = (actual or {}).get(device.name)
    if measured:
        text += "\n" + actual_line(values, measured)
    return text


def actual_line(predicted: Mapping[str, int], measured: Mapping[str, int]) -> str:
    """'after load: weights 16.5 MiB (predicted 16.5 MiB) · KV …' for the kinds llama.cpp logged."""
    pieces = []
    for name in ("weights", "KV", "recurrent", "compute"):
        if name in measured:
            pieces.append(
                f"{name} {format_size(measured[name], digits=1)} "
                f"[dim](predicted {format_size(predicted.get(name, 0), digits=1)})[/]"
            )
    return "[b]after load:[/b] " + " · ".join(pieces)


def actual_by_device(load_report: LoadReport) -> dict[str, dict[str, int]]:
    """llama.cpp's logged buffers (engine LoadReport.buffers) summed per device and kind."""
    buffers = load_report.buffers
    kinds = {
        "weights": buffers.model,
        "KV": buffers.kv,
        "recurrent": buffers.recurrent,
        "compute": buffers.compute,
    }
    result: dict[str, dict[str, int]] = {}
    for kind, by_buffer in kinds.items():
        for buffer_name, size_bytes in by_buffer.items():
            device = "CPU" if buffer_name in HOST_BUFFERS else buffer_name
            per_device = result.setdefault(device, {})
            per_device[kind] = per_device.get(kind, 0) + int(size_bytes)
    return result


def capacity_cells(row: CapacityRow) -> tuple[str, str, str, str]:
    pair = f"{row.type_k}/{row.type_v}"
    if row.max_ctx_memory == 0 and row.note:
        return pair, "—", "—", escape(row.note)
    note = "← chosen" if row.chosen else ""
    if row.note:
        note = f"{note} ({escape(row.note)})" if note else escape(row.note)
    return pair, f"{row.max_ctx:,}", human_tokens(row.max_ctx_memory), note
