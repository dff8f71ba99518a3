"""Plan a model for this machine, then load exactly that plan: how every verb and the TUI
start an engine.

    engine, plan = open_engine(resolve("demo:bench"), PlanRequest(parallel=4))

The knobs given in the :class:`~homelab.planner.search.PlanRequest` are fixed, the planner
chooses the rest for the file the ref loads (its own quant: a run never swaps in a sibling
file), :class:`Overrides` apply the serving knobs a plan leaves open, and the plan's *memory*
prediction goes into the calibration record next to what llama.cpp really allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homelab.errors import ModelFileError
from homelab.models.ref import ModelRef

if TYPE_CHECKING:
    from homelab.engine.engine import Engine
    from homelab.engine.speculation.config import SpeculationConfig
    from homelab.planner.budget import Hardware
    from homelab.planner.plan import Plan
    from homelab.planner.search import PlanRequest
    from homelab.settings import Settings


@dataclass(frozen=True)
class Overrides:
    """Serving knobs the planner leaves to the user (None: the plan's value)."""

    n_threads: int | None = None
    n_batch: int | None = None
    speculation: SpeculationConfig | None = None  # --spec ngram / --draft MODEL

    def apply(self, settings: Settings) -> Settings:
        if self.n_threads:
            settings = replace(settings, n_threads=self.n_threads)
        if self.n_batch:
            settings = replace(settings, n_batch=self.n_batch)
        return settings


def plan_file(
    ref: ModelRef,
    request: PlanRequest | None = None,
    hardware: Hardware | None = None,
    *,
    verify: bool = True,
) -> Plan:
    """The plan for the file ``ref`` loads, with ``request``'s knobs fixed (its ``quant`` is
    ignored: the file's own is used). Raises the ref's error when there is no file to load,
    PlanError when nothing fits."""
    from homelab.gguf.reader import read_model
    from homelab.models.mmproj import with_projector
    from homelab.planner.plan import plan_model
    from homelab.planner.search import PlanRequest

    info = read_model(ref.local_path())
    request = with_projector(replace(request or PlanRequest(), quant=None), info)
    return plan_model(info, hardware, request, verify=verify)


def load_plan(
    ref: ModelRef, plan: Plan, overrides: Overrides | None = None, **engine_options: Any
) -> Engine:
    """Load the file ``plan`` was made for (a sibling quant of ``ref`` when the planner chose
    one) with the plan's settings; ``engine_options`` go to :meth:`Engine.load`."""
    from homelab.engine.engine import Engine

    settings = (overrides or Overrides()).apply(plan.settings)
    if overrides is not None and overrides.speculation is not None:
        engine_options.setdefault("speculation", overrides.speculation)
    path = planned_file(ref, plan)
    return Engine.load(path, settings, predicted=plan.memory.to_dict(), **engine_options)


def open_engine(
    ref: ModelRef,
    request: PlanRequest | None = None,
    hardware: Hardware | None = None,
    overrides: Overrides | None = None,
    **engine_options: Any,
) -> tuple[Engine, Plan]:
    """Plan ``ref``'s file for ``hardware`` (default: this machine) and load the plan; a draft
    model in ``overrides.speculation`` is part of the plan (its memory, its vocabulary)."""
    plan = plan_file(ref, with_draft(request, overrides), hardware)
    return load_plan(ref, plan, overrides, **engine_options), plan


def with_draft(request: PlanRequest | None, overrides: Overrides | None) -> PlanRequest | None:
    """``request`` with the header of the draft ``overrides`` speculates with, if any."""
    speculation = overrides.speculation if overrides is not None else None
    if speculation is None or speculation.draft_path is None:
        return request
    if request is not None and request.draft is not None:
        return request
    from homelab.gguf.reader import read_model
    from homelab.planner.search import PlanRequest

    return replace(request or PlanRequest(), draft=read_model(speculation.draft_path))


def load_unplanned(ref: ModelRef, settings: Settings, **engine_options: Any) -> Engine:
    """Load ``ref``'s file with ``settings`` exactly as given (``--no-plan``)."""
    from homelab.engine.engine import Engine

    return Engine.load(ref.local_path(), settings, **engine_options)


def planned_file(ref: ModelRef, plan: Plan) -> Path:
    """The file to load for ``plan``: the one it was made from, when that is a local file, else
    ``ref``'s own file — provided it holds the quant the plan chose."""
    source = Path(plan.model_source)
    if source.is_file():
        return source
    path = ref.local_path()
    from homelab.gguf.reader import read_model

    quant = plan.settings.quant
    if quant and read_model(path).file_type.lower() != quant.lower():
        name = ref.pull_name(quant)
        raise ModelFileError(
            ref.text,
            f"the plan chose {quant}, which is not downloaded",
            hint=f"Download it first: homelab pull {name}" if name else None,
        )
    return path
