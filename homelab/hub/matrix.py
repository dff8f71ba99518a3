"""Plan before download: every quant of a repo × KV type, for this machine (or a GPU profile).

Each candidate file's header is read remotely (range requests, no download), each variant is
planned with the planner, and each row says where the weights go, how much context each KV
type reaches and the predicted decode speed. The planner's pick across all variants is the
answer to "which file should I get?".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from homelab.errors import HomelabError, HubError, PlanError
from homelab.gguf.model import ModelInfo
from homelab.hub.client import RepoListing
from homelab.hub.labels import placement, speed_label, tokens_label
from homelab.hub.quants import GgufEntry
from homelab.hub.remote import remote_models
from homelab.hub.render import table
from homelab.hub.settings import HubSettings
from homelab.planner.budget import Hardware
from homelab.planner.memory import MemoryModel
from homelab.planner.plan import Plan, plan_model
from homelab.planner.predict import predict_speed
from homelab.planner.search import PlanRequest
from homelab.units import format_size


@dataclass(frozen=True)
class MatrixCell:
    """One KV type with one quant."""

    kv: str  # "f16/f16", "q8_0/q8_0"…
    max_ctx: int  # per-slot context reachable, up to the trained context (0: not even 256)
    decode_tok_s: float | None  # one stream, predicted
    note: str | None  # why the KV type cannot be used, or that it is slow here


@dataclass(frozen=True)
class MatrixRow:
    """One quant (a file or a split set) of the repo."""

    quant: str
    size_bytes: int
    fits: bool
    placement: str  # "all on GPU", "30/41 layers on GPU", "CPU", or why it does not fit
    cells: tuple[MatrixCell, ...]
    problem: str | None  # the header could not be read, or nothing fits
    best: bool  # the planner's pick across every quant


@dataclass(frozen=True)
class PlanMatrix:
    repo_id: str
    commit: str
    hardware: str  # what was planned for, in words
    trained_context: int | None
    rows: tuple[MatrixRow, ...]

    @property
    def best(self) -> MatrixRow | None:
        return next((row for row in self.rows if row.best), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hardware_label(hardware: Hardware) -> str:
    gpus = [d.label for d in hardware.devices if d.kind == "gpu"]
    return " + ".join(gpus) if gpus else "no GPU (CPU and RAM only)"


def build_matrix(settings: HubSettings, listing: RepoListing, hardware: Hardware) -> PlanMatrix:
    """Read every entry's header remotely and plan it on ``hardware``."""
    if not listing.entries:
        raise HubError(f"{listing.repo_id} has no GGUF model files to plan.")
    models = remote_models(settings, listing, listing.entries)
    readable = [m for m in models if isinstance(m, ModelInfo)]
    best_source = _best_source(readable, hardware)
    rows = tuple(
        _row(entry, model, hardware, best_source)
        for entry, model in zip(listing.entries, models, strict=True)
    )
    trained = readable[0].context_length if readable else None
    return PlanMatrix(listing.repo_id, listing.commit, hardware_label(hardware), trained, rows)


def best_entry(settings: HubSettings, listing: RepoListing, hardware: Hardware) -> GgufEntry:
    """The entry the planner picks for ``hardware`` (used by ``homelab pull REPO``)."""
    matrix = build_matrix(settings, listing, hardware)
    best = matrix.best
    if best is None:
        raise PlanError(
            f"No quant of {listing.repo_id} fits {matrix.hardware}.",
            hint=f"See `homelab search {listing.repo_id} --plan`.",
        )
    return next(e for e, row in zip(listing.entries, matrix.rows, strict=True) if row is best)


def _best_source(models: list[ModelInfo], hardware: Hardware) -> str | None:
    if not models:
        return None
    try:
        return plan_model(models, hardware, PlanRequest(), verify=False).model_source
    except PlanError:
        return None


def _row(
    entry: GgufEntry, model: ModelInfo | HomelabError, hardware: Hardware, best_source: str | None
) -> MatrixRow:
    if not isinstance(model, ModelInfo):
        return MatrixRow(entry.quant, entry.total_bytes, False, "unreadable", (), str(model), False)
    try:
        plan = plan_model(model, hardware, PlanRequest(), verify=False)
    except PlanError as error:
        return MatrixRow(
            entry.quant, entry.total_bytes, False, "does not fit", (), str(error), False
        )
    return MatrixRow(
        entry.quant,
        entry.total_bytes,
        plan.fits,
        placement(plan),
        _cells(plan, model, hardware),
        None,
        model.source == best_source,
    )


def _cells(plan: Plan, model: ModelInfo, hardware: Hardware) -> tuple[MatrixCell, ...]:
    memory = MemoryModel(model)
    cells = []
    for row in plan.capacity:
        kv = f"{row.type_k}/{row.type_v}"
        speed = None
        if row.max_ctx > 0:
            settings = replace(plan.settings, type_k=row.type_k, type_v=row.type_v)
            speed = predict_speed(memory, settings, hardware).decode_tok_s
        cells.append(MatrixCell(kv, row.max_ctx, speed, row.note))
    return tuple(cells)


# ---- rendering ----------------------------------------------------------------------------


def render_matrix(matrix: PlanMatrix) -> str:
    kv_types = [c.kv for c in next((r.cells for r in matrix.rows if r.cells), ())]
    headers = ["QUANT", ">SIZE", "WEIGHTS", *(f"KV {kv.split('/')[0]}" for kv in kv_types)]
    rows = [_render_row(row, len(kv_types)) for row in matrix.rows]
    trained = f", trained context {matrix.trained_context:,}" if matrix.trained_context else ""
    lines = [
        f"{matrix.repo_id} on {matrix.hardware}{trained}",
        "Each KV column: context per request reachable · predicted decode speed",
        "",
        table(headers, rows),
        "",
    ]
    lines += [f"  {row.quant}: {row.problem}" for row in matrix.rows if row.problem]
    best = matrix.best
    if best is not None:
        lines.append(
            f"Best fit: {best.quant} ({best.placement}) -> "
            f"homelab pull {matrix.repo_id}:{best.quant}"
        )
    else:
        lines.append("No quant of this repo fits; try a smaller model or another machine.")
    return "\n".join(lines) + "\n"


def _render_row(row: MatrixRow, n_kv: int) -> list[str]:
    mark = "*" if row.best else " "
    if not row.cells:
        return [f"{mark}{row.quant}", format_size(row.size_bytes), row.placement, *["-"] * n_kv]
    cells = [_render_cell(c) for c in row.cells][:n_kv]
    return [f"{mark}{row.quant}", format_size(row.size_bytes), row.placement, *cells]


def _render_cell(cell: MatrixCell) -> str:
    if cell.max_ctx <= 0:
        return "no" if cell.note is None else "n/a"
    speed = "" if cell.decode_tok_s is None else f" · {speed_label(cell.decode_tok_s)}"
    return f"{tokens_label(cell.max_ctx)}{speed}"
