"""Past-tense messages that workers and background threads post to the app.

Workers never touch widgets: they post one of these (``App.post_message`` is thread-safe)
and the app applies it on the event loop.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from homelab.errors import HomelabError
from homelab.hardware.report import HardwareReport
from homelab.tui.services import ModelChoice


class HardwareDetected(Message):
    def __init__(self, report: HardwareReport) -> None:
        super().__init__()
        self.report = report


class ModelChosen(Message):
    def __init__(self, choice: ModelChoice) -> None:
        super().__init__()
        self.choice = choice


class PlanComputed(Message):
    """``generation`` lets the app drop a plan that a newer knob change has superseded."""

    def __init__(self, plan: Any, generation: int) -> None:
        super().__init__()
        self.plan = plan
        self.generation = generation


class PlanFailed(Message):
    def __init__(self, error: HomelabError, generation: int) -> None:
        super().__init__()
        self.error = error
        self.generation = generation


class ModelLoaded(Message):
    def __init__(self, engine: Any, load_s: float) -> None:
        super().__init__()
        self.engine = engine
        self.load_s = load_s


class ModelUnloaded(Message):
    pass


class TaskFailed(Message):
    """A background action failed; the app shows ``error`` as a titled notification/modal."""

    def __init__(self, action: str, error: HomelabError, *, modal: bool = False) -> None:
        super().__init__()
        self.action = action
        self.error = error
        self.modal = modal


class AnswerFinished(Message):
    def __init__(self, finish: Any) -> None:
        super().__init__()
        self.finish = finish


class ServerStarted(Message):
    def __init__(self, handle: Any) -> None:
        super().__init__()
        self.handle = handle


class ServerStopped(Message):
    pass


class ModelsListed(Message):
    def __init__(self, choices: list[ModelChoice]) -> None:
        super().__init__()
        self.choices = choices


class FitComputed(Message):
    def __init__(self, choice: ModelChoice, badge: Any) -> None:
        super().__init__()
        self.choice = choice
        self.badge = badge


class ModelPulled(Message):
    def __init__(self, choice: ModelChoice, notes: list[str]) -> None:
        super().__init__()
        self.choice = choice
        self.notes = notes
