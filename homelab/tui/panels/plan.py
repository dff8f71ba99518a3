"""The plan panel's controller: which model, its knobs, and the plan for this machine.

Every change (hardware detected, model chosen, knob turned) re-plans at once from the memory
model; for a file on disk a llama.cpp dry run then confirms the plan. ``generation`` numbers
each request so a plan that a newer change superseded is dropped on arrival.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from textual.worker import get_current_worker

from homelab.errors import HomelabError
from homelab.tui import services
from homelab.tui.knobs import CONTEXT_CHOICES, KV_CHOICES, SLOT_CHOICES, Knobs, cycle
from homelab.tui.messages import ModelChosen, PlanComputed, PlanFailed, TaskFailed
from homelab.tui.panels import in_thread
from homelab.tui.plan_view import plan_view

if TYPE_CHECKING:
    from textual.app import App

    from homelab.hardware.report import HardwareReport
    from homelab.planner.plan import Plan
    from homelab.tui.protocols import DashboardEngine
    from homelab.tui.services import ModelChoice
    from homelab.tui.widgets.plan import PlanPanel

KNOB_CHOICES: dict[str, tuple[object, ...]] = {
    "kv_type": KV_CHOICES,
    "n_ctx_per_slot": CONTEXT_CHOICES,
    "n_parallel": SLOT_CHOICES,
}


class PlanController:
    panel: PlanPanel  # attached once the dashboard is mounted

    def __init__(
        self,
        app: App[None],
        *,
        verify: bool,
        rpc: tuple[str, ...] = (),
        rpc_budget_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.verify = verify  # confirm each plan of a local file with a llama.cpp dry run
        self.rpc = rpc  # --rpc: the workers' devices are devices of every plan
        self.rpc_budget_bytes = rpc_budget_bytes  # --rpc-budget: capping each of them
        self.report: HardwareReport | None = None
        self.choice: ModelChoice | None = None
        self.knobs = Knobs()
        self.plan: Plan | None = None
        self.generation = 0

    def attach(self, panel: PlanPanel) -> None:
        self.panel = panel

    # --- the model -----------------------------------------------------------------------

    def choose(self, requested: str | None) -> None:
        in_thread(self.app, lambda: self._choose(requested), name="choose_model", group="choose")

    def _choose(self, requested: str | None) -> None:
        try:
            self.app.post_message(ModelChosen(services.choose_model(requested)))
        except HomelabError as error:
            self.app.post_message(TaskFailed("choosing the model", error, modal=True))

    def set_choice(self, choice: ModelChoice) -> None:
        self.choice = choice
        self.app.sub_title = choice.title
        self.panel.show_model(services.model_line(choice))
        if self.knobs.quant is not None:  # another model's quants mean nothing here
            self.set_knobs(replace(self.knobs, quant=None), replan=False)
        self.request()

    def set_report(self, report: HardwareReport) -> None:
        self.report = report
        self.request()

    # --- knobs ---------------------------------------------------------------------------

    def knobs_changed(self, knobs: Knobs) -> None:
        """The user turned a knob in the panel (which already shows it)."""
        self.knobs = knobs
        self.request()

    def set_knobs(self, knobs: Knobs, *, replan: bool = True) -> None:
        self.knobs = knobs
        self.panel.set_knobs(knobs)
        if replan:
            self.request()

    def cycle_knob(self, name: str) -> object:
        """Turn knob ``name`` to its next value (after the last: auto) and re-plan."""
        value = cycle(getattr(self.knobs, name), KNOB_CHOICES[name])
        self.set_knobs(self.knobs.with_value(name, "auto" if value is None else str(value)))
        return value

    def knob_setter(self, name: str, raw: str) -> Callable[[], None]:
        """A command-palette entry: set knob ``name`` to ``raw`` ("auto" or a value)."""
        return lambda: self.set_knobs(self.knobs.with_value(name, raw))

    # --- planning ------------------------------------------------------------------------

    def request(self) -> None:
        if self.report is None or self.choice is None:
            return
        self.generation += 1
        self.panel.show_planning()
        choice, report, knobs, generation = self.choice, self.report, self.knobs, self.generation
        in_thread(
            self.app,
            lambda: self._compute(choice, report, knobs, generation),
            name="compute_plan",
            group="plan",
        )

    def _compute(
        self, choice: ModelChoice, report: HardwareReport, knobs: Knobs, generation: int
    ) -> None:
        """Plan at once from the memory model, then (for a local file) confirm it with a
        llama.cpp dry run and show the verified plan too."""
        try:
            rpc, budget = self.rpc, self.rpc_budget_bytes
            plan = services.plan_choice(choice, report, knobs, rpc=rpc, rpc_budget_bytes=budget)
            self.app.post_message(PlanComputed(plan, generation))
            if self.verify and choice.runnable and not get_current_worker().is_cancelled:
                verified = services.plan_choice(
                    choice, report, knobs, verify=True, rpc=rpc, rpc_budget_bytes=budget
                )
                self.app.post_message(PlanComputed(verified, generation))
        except HomelabError as error:
            self.app.post_message(PlanFailed(error, generation))

    async def show_plan(self, message: PlanComputed, engine: DashboardEngine | None) -> bool:
        """Show a computed plan (with what ``engine`` really allocated, when one is loaded);
        False when a newer request superseded it."""
        if message.generation != self.generation:
            return False
        self.plan = message.plan
        self.panel.set_quant_options(services.quant_options(message.plan))
        load_report = services.load_report(engine) if engine is not None else None
        await self.panel.show_plan(plan_view(message.plan, load_report))
        if engine is not None and engine.settings != message.plan.settings:
            self.panel.show_stale_engine()
        return True

    async def show_failure(self, message: PlanFailed) -> None:
        if message.generation != self.generation:
            return
        self.plan = None
        await self.panel.show_failure(message.error.title, str(message.error))

    def adopt(self, plan: Plan) -> None:
        """Show ``plan``, the one the model was loaded with again (a resume re-plans for the
        VRAM free then: maybe fewer layers on the GPU)."""
        self.generation += 1
        self.app.post_message(PlanComputed(plan, self.generation))

    def refresh_view(self) -> None:
        """Show the current plan again (after a load: predicted next to actual)."""
        if self.plan is not None:
            self.app.post_message(PlanComputed(self.plan, self.generation))
