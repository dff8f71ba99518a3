"""How a model fits this machine, as one line for listings (``homelab models``, the picker).

A thin adapter over the planner: each model is planned (memory model only, no dry run) for
the hardware detected once — the memory free now — and a listing keeps the placement,
context per slot, KV cache type and predicted speed.
A model that does not fit says so, with the ``homelab quantize`` command when it is a
high-precision file that a smaller quant could make fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homelab.errors import HomelabError, PlanError
from homelab.gguf.model import ModelInfo
from homelab.hub.labels import placement, speed_label, tokens_label


@dataclass(frozen=True)
class Fit:
    fits: bool
    summary: str  # "all on GPU · 32k ctx · KV q8_0 · 41.0 t/s", or "does not fit — smaller: …"
    detail: str | None  # the planner's full explanation when it does not fit
    n_ctx_per_slot: int | None
    decode_tok_s: float | None
    quantize_command: str | None  # offered when the file is F16/BF16/Q8_0 and does not fit
    kv: str | None = None  # the KV cache types the plan chose, "q8_0" or "q8_0/f16"
    placement: str | None = None  # "all on GPU", "30/41 layers on GPU", "CPU"


def fits_on_this_machine(
    models: Sequence[ModelInfo | None], hardware: object | None = None
) -> list[Fit | None]:
    """One Fit per model (None for unreadable models), planned on ``hardware`` or this machine."""
    from homelab.planner.budget import Hardware, resolve_hardware

    if not any(models):
        return [None] * len(models)
    target = hardware if isinstance(hardware, Hardware) else resolve_hardware()
    return [None if model is None else fit_for(model, target) for model in models]


def fit_for(model: ModelInfo, hardware: object) -> Fit:
    from homelab.hub.local_quantize import quantize_suggestion
    from homelab.planner.plan import plan_model
    from homelab.planner.search import PlanRequest

    try:
        plan = plan_model(model, hardware, PlanRequest(), verify=False)  # type: ignore[arg-type]
    except PlanError as error:
        command = quantize_suggestion(model)
        advice = f" — smaller: {command}" if command else ""
        return Fit(False, f"does not fit{advice}", str(error), None, None, command)
    except HomelabError as error:  # an odd model the planner cannot handle: list it anyway
        return Fit(False, "cannot plan", str(error), None, None, None)
    s = plan.settings
    kv = s.type_k if s.type_k == s.type_v else f"{s.type_k}/{s.type_v}"
    speed = plan.predicted.decode_tok_s
    where = placement(plan)
    summary = f"{where} · {tokens_label(s.n_ctx_per_slot)} ctx · KV {kv} · {speed_label(speed)}"
    return Fit(plan.fits, summary, None, s.n_ctx_per_slot, speed, None, kv, where)
