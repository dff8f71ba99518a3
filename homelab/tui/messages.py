"""Every message of the dashboard: small past-tense records.

Workers never touch widgets: they post one of these (``App.post_message`` is thread-safe)
and the app routes it to the panel it concerns, on the event loop. Widgets post the user's
requests the same way (a prompt submitted, a knob turned), and the app decides what follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from homelab.engine.api import FinishEvent
    from homelab.errors import HomelabError
    from homelab.hardware.report import HardwareReport
    from homelab.planner.plan import Plan
    from homelab.tui.knobs import Knobs
    from homelab.tui.protocols import DashboardEngine, ServerLike
    from homelab.tui.services import FitBadge, ImageAttachment, ModelChoice, WorkerLine

# --- posted by workers ---------------------------------------------------------------------


@dataclass
class HardwareDetected(Message):
    report: HardwareReport
    workers: tuple[WorkerLine, ...] = ()  # the --rpc workers' devices, probed with it


@dataclass
class ModelChosen(Message):
    choice: ModelChoice


@dataclass
class PlanComputed(Message):
    """``generation`` lets the app drop a plan that a newer knob change has superseded."""

    plan: Plan
    generation: int


@dataclass
class PlanFailed(Message):
    error: HomelabError
    generation: int


@dataclass
class ModelLoaded(Message):
    engine: DashboardEngine
    load_s: float
    choice: ModelChoice | None = None  # what was loaded, with which plan (a yield reloads it)
    plan: Plan | None = None


@dataclass
class ModelUnloaded(Message):
    pass


@dataclass
class ImageAttached(Message):
    """An image read, decoded and counted (``/image PATH`` in the chat): sent with the next
    prompt."""

    attachment: ImageAttachment


@dataclass
class TaskFailed(Message):
    """A background action failed; the app shows ``error`` as a titled notification/modal."""

    action: str
    error: HomelabError
    modal: bool = False


@dataclass
class AnswerFinished(Message):
    finish: FinishEvent | None  # None: the stream broke off (a TaskFailed says why)


@dataclass
class ServerStarted(Message):
    server: ServerLike


@dataclass
class ServerStopped(Message):
    pass


@dataclass
class YieldChanged(Message):
    """The GPU was given back or taken again (by the dashboard, or ``homelab yield`` against
    its server): the live panel reads the controller's state."""


@dataclass
class ModelsListed(Message):
    choices: list[ModelChoice]


@dataclass
class FitComputed(Message):
    choice: ModelChoice
    badge: FitBadge


@dataclass
class ModelPulled(Message):
    choice: ModelChoice
    notes: list[str]


# --- wake-ups from background threads (at most one in flight: see live.Coalescer) ----------


@dataclass
class MetricsUpdated(Message):
    """The engine published new metrics."""


@dataclass
class PullProgressed(Message):
    """A download made progress."""


@dataclass
class RequestsLogged(Message):
    """The server logged requests (drained from an ``Inbox``)."""


# --- posted by widgets: what the user asked for --------------------------------------------


@dataclass
class PromptSubmitted(Message):
    prompt: str


@dataclass
class CancelRequested(Message):
    """Esc in the chat while an answer streams."""


@dataclass
class KnobsChanged(Message):
    knobs: Knobs


@dataclass
class ServerToggleRequested(Message):
    """The server panel's start/stop button was pressed."""


@dataclass
class UnloadRequested(Message):
    """The server panel's unload button was pressed for the model it lists."""


@dataclass
class DownloadRequested(Message):
    choice: ModelChoice
    quant: str | None
