"""A plan as readable text: the chosen knobs, memory bars per device, the capacity table, the
predicted speed, what llama.cpp confirmed, and the reasons."""

from __future__ import annotations

from homelab.planner.budget import RESERVED_NOTE_PREFIX
from homelab.planner.memory import DeviceMemory
from homelab.planner.plan import CapacityRow, Plan, Verification
from homelab.planner.search import CAPACITY_LIMIT_TOKENS
from homelab.units import format_size

BAR_WIDTH = 28
NAME_WIDTH = 30
# one character per component, in stacking order
# the character each part of DeviceMemory.parts() is drawn with (by label)
BAR_CHARACTERS = {
    "weights": "█",
    "KV": "▓",
    "recurrent": "▒",
    "compute": "▒",
    "overhead": "░",
    "draft": "▚",
    "projector": "▞",
}
FREE = "·"


def render_plan(plan: Plan) -> str:
    sections = [
        _title(plan),
        _chosen(plan),
        _memory(plan),
        _capacity(plan),
        _predicted(plan),
        _verified(plan.verified),
        _reasons(plan),
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _title(plan: Plan) -> str:
    where = ", ".join(d.label for d in plan.hardware.gpus) or "CPU only"
    state = "fits" if plan.fits else "DOES NOT FIT"
    return f"{plan.model_name} ({plan.architecture}) on {where} · goal: {plan.goal} · {state}"


def _chosen(plan: Plan) -> str:
    s = plan.settings
    offload = _offload_text(plan)
    flash = "on" if s.flash_attn else "off"
    swa_full = "on" if s.swa_full else "off"
    rows = [
        ("quant", f"{s.quant}   (of {', '.join(plan.quants_considered)})"),
        ("context", f"{s.n_ctx_per_slot} tokens per slot × {s.n_parallel} slot(s) = "
                    f"n_ctx {s.n_ctx}   (trained {plan.trained_context})"),
        ("KV cache", f"{s.type_k} / {s.type_v}   flash attention {flash}"),
        ("offload", offload),
        ("batch", f"n_ubatch {s.n_ubatch}, n_batch {s.n_batch}, swa_full {swa_full}"),
    ]  # fmt: skip
    if s.tensor_split:
        rows.append(("split", _split_text(plan)))
    if s.split_mode != "layer" and plan.hardware.gpus:
        main = plan.hardware.gpus[min(s.main_gpu, len(plan.hardware.gpus) - 1)].name
        where = f"every offloaded layer on {main}" if s.split_mode == "none" else "rows (CUDA)"
        rows.append(("split", f"split mode {s.split_mode}: {where}"))
    return "Chosen\n" + "\n".join(f"  {name:<9} {value}" for name, value in rows)


def _split_text(plan: Plan) -> str:
    total = sum(plan.settings.tensor_split) or 1.0
    shares = [
        f"{device.name} {100 * share / total:.0f}%"
        for device, share in zip(plan.hardware.gpus, plan.settings.tensor_split, strict=False)
    ]
    return "tensor split " + ", ".join(shares) + " (passed to llama.cpp as planned)"


def _offload_text(plan: Plan) -> str:
    s, full = plan.settings, plan.full_offload_layers
    if not plan.hardware.has_gpu:
        return "everything on the CPU"
    where = "the GPU" if not plan.hardware.has_remote else "the offload devices (see split)"
    text = f"{min(s.n_gpu_layers, full)}/{full} layers on {where}"
    if s.n_cpu_moe:
        text += f", experts of {s.n_cpu_moe} blocks on the CPU"
    return text


def _memory(plan: Plan) -> str:
    columns = ("weights", "KV", "compute", "overhead", "total", "budget")
    header = f"  {'device':<{NAME_WIDTH}} {'':<{BAR_WIDTH}} " + " ".join(
        f"{c:>10}" for c in columns
    )
    lines = [f"Memory   ({_bar_legend(plan)})", header]
    for device in reversed(plan.memory.devices):  # GPUs first
        lines.append(_device_line(device))
    if plan.memory.draft is not None:
        lines.extend(_draft_lines(plan))
    if plan.projector is not None:
        lines.append(_projector_line(plan))
    lines.extend(f"  {n}" for n in plan.hardware.notes if n.startswith(RESERVED_NOTE_PREFIX))
    remote = [d for d in plan.hardware.gpus if d.endpoint]
    if remote:
        lines.append("  RPC workers (unauthenticated: loopback or a private link only)")
        lines.extend(f"    {d.name}: {d.label} · {d.budget_note}" for d in remote)
    return "\n".join(lines)


def _draft_lines(plan: Plan) -> list[str]:
    """The draft's own bytes (already inside each device's total above)."""
    draft = plan.memory.draft
    assert draft is not None
    where = ", ".join(
        f"{d.name} {format_size(d.draft_bytes)}" for d in plan.memory.devices if d.draft_bytes
    )
    cells = [
        format_size(v)
        for v in (draft.weights_bytes, draft.kv_bytes, draft.compute_bytes, draft.overhead_bytes)
    ]
    name = f"draft {plan.draft_name}"[:NAME_WIDTH]
    return [
        f"  {name:<{NAME_WIDTH}} {'(in the totals above)':<{BAR_WIDTH}} "
        + " ".join(f"{c:>10}" for c in cells)
        + f" {format_size(plan.memory.draft_bytes):>10}   on {where}"
    ]


def _projector_line(plan: Plan) -> str:
    """The vision projector's bytes (inside its device's total above) and its image budget."""
    projector = plan.projector
    assert projector is not None
    device = next((d.name for d in plan.memory.devices if d.projector_bytes), "CPU")
    tokens = projector.image_max_tokens
    each = "exactly" if projector.fixed_tokens else "up to"
    images = f"images {each} {tokens} tokens" if tokens else "image tokens: the projector's rule"
    return (
        f"  projector {projector.projector_type} on {device}: "
        f"{format_size(projector.weights_bytes)} weights + "
        f"{format_size(projector.compute_bytes)} compute ({projector.compute_source}) = "
        f"{format_size(projector.total_bytes)} (in the totals above) · {images}"
    )


def _device_line(device: DeviceMemory) -> str:
    label = device.label.split(" (profile")[0]
    remote = label.startswith("worker ")  # an RPC device: its worker is listed below the table
    name = (device.name if remote else f"{device.name} {label}")[:NAME_WIDTH]
    kv = device.kv_bytes + device.recurrent_bytes
    cells = [
        format_size(v)
        for v in (device.weights_bytes, kv, device.compute_bytes, device.overhead_bytes)
    ]
    used = 100 * device.total_bytes / max(device.budget_bytes, 1)
    cells += [format_size(device.total_bytes), format_size(device.budget_bytes)]
    return (
        f"  {name:<{NAME_WIDTH}} {memory_bar(device)} "
        + " ".join(f"{c:>10}" for c in cells)
        + (f" {used:4.0f}%")
    )


def memory_bar(device: DeviceMemory, width: int = BAR_WIDTH) -> str:
    """A stacked bar of the device's budget; over budget it spans the total and ends in '!'."""
    scale = max(device.budget_bytes, device.total_bytes, 1)
    bar = ""
    used = 0.0
    for part in device.parts():
        used += part.size_bytes / scale * width
        bar += BAR_CHARACTERS[part.label] * (round(used) - len(bar))
    bar += FREE * (width - len(bar))
    return bar[: width - 1] + "!" if not device.fits else bar


def _bar_legend(plan: Plan) -> str:
    """'█ weights ▓ KV ▒ compute/recurrent ░ overhead · free', plus the draft and the
    projector when this plan holds them."""
    shown = ["█ weights", "▓ KV", "▒ compute/recurrent", "░ overhead"]
    if plan.memory.draft_bytes:
        shown.append(f"{BAR_CHARACTERS['draft']} draft")
    if plan.memory.projector_bytes:
        shown.append(f"{BAR_CHARACTERS['projector']} projector")
    return " ".join(shown) + f" {FREE} free"


def _capacity(plan: Plan) -> str:
    s = plan.settings
    where = _offload_text(plan)
    with_draft = plan.draft_name is not None
    header = f"  {'KV K/V':<12} {'max context':>12} {'memory allows':>14}"
    if with_draft:
        header += f" {'without draft':>14}"
        where += f", with draft {plan.draft_name}"
    lines = [
        f"Capacity per slot ({s.n_parallel} slot(s), {s.quant}, {where}, n_ubatch {s.n_ubatch})",
        header,
    ]
    lines.extend(_capacity_line(row, with_draft) for row in plan.capacity)
    return "\n".join(lines)


def _capacity_line(row: CapacityRow, with_draft: bool = False) -> str:
    pair = f"{row.type_k}/{row.type_v}"
    if row.max_ctx_memory == 0 and row.note:
        return f"  {pair:<12} {'—':>12} {'—':>14}   {row.note}"
    mark = "   ← chosen" if row.chosen else ""
    note = f"   ({row.note})" if row.note else ""
    memory = f"{row.max_ctx_memory}"
    if row.max_ctx_memory >= CAPACITY_LIMIT_TOKENS:
        memory = f"≥{CAPACITY_LIMIT_TOKENS}"
    without = f" {row.max_ctx_without_draft or 0:>14}" if with_draft else ""
    return f"  {pair:<12} {row.max_ctx:>12} {memory:>14}{without}{mark}{note}"


def _predicted(plan: Plan) -> str:
    p = plan.predicted
    return (
        f"Predicted  {p.decode_tok_s:.0f} tok/s decode at {p.context_fill} tokens of context "
        f"({p.decode_tok_s_full_context:.0f} with the slot full), "
        f"{p.prefill_tok_s:.0f} tok/s prefill"
        f"\n           basis: {p.basis} — {p.detail}"
    )


def _verified(verification: Verification) -> str:
    lines = [f"Verified   {verification.method}: {verification.detail}"]
    for c in verification.comparisons:
        state = "exact" if c.exact else f"{c.error_pct:+.1f}%"
        lines.append(
            f"           {c.what:<22} planner {format_size(c.predicted_bytes):>11}   "
            f"llama.cpp {format_size(c.engine_bytes):>11}   {state}"
        )
    return "\n".join(lines)


def _reasons(plan: Plan) -> str:
    return "Why\n" + "\n".join(f"  • {reason}" for reason in plan.reasons)
