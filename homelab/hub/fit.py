"""How a model fits this machine, as one line for listings (``homelab models``, the picker).

A thin adapter over the planner: it plans each model for the detected hardware and keeps
what a listing shows. When the planner is not available it reports nothing (None), so
listing models never fails because planning does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homelab.gguf.model import ModelInfo


@dataclass(frozen=True)
class Fit:
    fits: bool  # runs with the model's weights where the plan put them
    summary: str  # e.g. "GPU, 32,768 ctx, ~41 tok/s" or "no: needs 9.10 GiB"
    n_ctx: int | None
    predicted_tok_s: float | None


def fits_on_this_machine(models: Sequence[ModelInfo | None]) -> list[Fit | None]:
    planner = _planner()
    if planner is None:
        return [None] * len(models)
    return [planner(model) if model is not None else None for model in models]


def _planner():  # type: ignore[no-untyped-def]
    return None
