"""The dashboard's controllers, one per panel: each owns its state and its workers.

``hardware`` (detect, sample), ``plan`` (choose, plan, knobs), ``live`` (load, unload, live
metrics), ``chat`` (submit, stream, cancel), ``server`` (start, stop, request log) and
``picker`` (list, fit badges, download). :mod:`homelab.tui.app` composes them and routes each
message to the one it concerns; a controller renders through its widget and reaches the core
only through :mod:`homelab.tui.services`, from thread workers that cannot crash the app and
answer with messages (:mod:`homelab.tui.messages`).
"""

from __future__ import annotations

from collections.abc import Callable

from textual.app import App
from textual.worker import Worker


def in_thread(
    app: App[None], work: Callable[[], object], *, name: str, group: str, exclusive: bool = True
) -> Worker[object]:
    """Run blocking ``work`` in a thread worker; an exception is reported, never fatal."""
    return app.run_worker(
        work, name=name, group=group, thread=True, exit_on_error=False, exclusive=exclusive
    )


def busy(app: App[None], group: str) -> bool:
    """Whether a worker of ``group`` is running now."""
    return any(worker.group == group and worker.is_running for worker in app.workers)
