"""The model picker's controller: list the models, badge how each fits, download one.

The picker is a modal screen; what the workers find is shown only while it is open. A
download's progress arrives through a :class:`Coalescer` (its thousands of chunks become a
few UI updates); the downloaded model becomes the chosen one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from homelab.errors import HomelabError
from homelab.tui import services
from homelab.tui.handoff import Coalescer, PullProgress
from homelab.tui.messages import FitComputed, ModelPulled, ModelsListed, PullProgressed, TaskFailed
from homelab.tui.panels import busy, in_thread
from homelab.tui.screens.picker import ModelPicker

if TYPE_CHECKING:
    from textual.app import App

    from homelab.tui.messages import DownloadRequested
    from homelab.tui.panels.hardware import HardwareController
    from homelab.tui.panels.plan import PlanController
    from homelab.tui.services import ModelChoice


class PickerController:
    def __init__(
        self,
        app: App[None],
        plans: PlanController,
        hardware: HardwareController,
        *,
        on_chosen: Callable[[ModelChoice], None],
    ) -> None:
        self.app = app
        self.plans = plans  # the current choice
        self.hardware = hardware  # the machine the fit badges are planned for
        self.on_chosen = on_chosen
        self.pull_progress: Coalescer[tuple[str, int, int]] = Coalescer(
            lambda: app.post_message(PullProgressed())
        )

    @property
    def picker(self) -> ModelPicker | None:
        """The picker, while it is the screen shown."""
        screen = self.app.screen
        return screen if isinstance(screen, ModelPicker) else None

    def open(self) -> None:
        if self.picker is not None:
            return
        self.app.push_screen(ModelPicker(current=self.plans.choice), self._picked)
        in_thread(self.app, self._list, name="list_models", group="picker")

    def _picked(self, choice: ModelChoice | None) -> None:
        if choice is not None and choice != self.plans.choice:
            self.on_chosen(choice)

    def _list(self) -> None:
        choices = services.picker_choices()
        self.app.post_message(ModelsListed(choices))
        report = self.hardware.report
        if report is None:
            return
        for choice in choices:
            self.app.post_message(FitComputed(choice, services.fit_badge(choice, report)))

    def show_choices(self, choices: list[ModelChoice]) -> None:
        if self.picker is not None:
            self.picker.show_choices(choices)

    def show_badge(self, message: FitComputed) -> None:
        if self.picker is not None:
            self.picker.show_badge(message.choice, message.badge)

    # --- downloading ---------------------------------------------------------------------

    def download(self, message: DownloadRequested) -> None:
        if busy(self.app, "pull"):
            self.app.notify("One download at a time.", title="Already downloading")
            return
        choice, quant = message.choice, message.quant
        in_thread(self.app, lambda: self._pull(choice, quant), name="pull_model", group="pull")

    def _pull(self, choice: ModelChoice, quant: str | None) -> None:
        progress = PullProgress(self.pull_progress)
        try:
            local = services.pull_choice(choice, quant, progress)
        except HomelabError as error:
            self.app.post_message(TaskFailed("downloading the model", error, modal=True))
        else:
            self.app.post_message(ModelPulled(local, progress.notes))

    def show_progress(self) -> None:
        progress = self.pull_progress.take()
        if progress is not None and self.picker is not None:
            self.picker.show_progress(*progress)

    def pulled(self, message: ModelPulled) -> None:
        notes = "".join(f"\n{note}" for note in message.notes)
        self.app.notify(f"{message.choice.label}{notes}", title="Downloaded")
        if self.picker is not None:
            self.picker.dismiss(message.choice)  # _picked switches to it
        else:
            self.on_chosen(message.choice)
