"""A plan in a few words, as listings and the plan matrix print it: where the weights go, a
context size, a decode speed."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from homelab.planner.plan import Plan


def placement(plan: Plan) -> str:
    if not plan.hardware.has_gpu or plan.settings.n_gpu_layers == 0:
        return "CPU"
    full = plan.full_offload_layers
    on_gpu = min(plan.settings.n_gpu_layers, full)
    moe = f", experts of {plan.settings.n_cpu_moe} on CPU" if plan.settings.n_cpu_moe else ""
    return ("all on GPU" if on_gpu >= full else f"{on_gpu}/{full} layers on GPU") + moe


def tokens_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def speed_label(tok_s: float) -> str:
    return f"{tok_s:.1f} t/s" if tok_s < 100 else f"{tok_s:,.0f} t/s"
