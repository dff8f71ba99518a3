"""`make run` on a fresh machine, in a real pseudo-terminal (tmux): the dashboard appears.

The app runs with a fresh HOMELAB_HOME and an empty Hugging Face cache, so it must pick the
generated demo model and say plainly that it is one. ``q`` quits it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PANE_COLUMNS, PANE_ROWS = 100, 30
STARTUP_TIMEOUT_S = 60.0

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None,
    reason="tmux is not installed (apt-get install -y tmux); the smoke test needs a real pty",
)


SOCKET = f"homelab-test-{uuid.uuid4().hex[:8]}"  # a private tmux server, not the user's


def tmux(*args: str, check: bool = False) -> str:
    result = subprocess.run(
        ["tmux", "-L", SOCKET, *args], capture_output=True, text=True, timeout=30, check=check
    )
    return result.stdout


def run_command() -> str:
    """`make run` when the install stamp is current (so make only starts the app), else the
    entry point it would start (a stale stamp would make `make run` reinstall first)."""
    up_to_date = subprocess.run(
        ["make", "-q", ".venv/.installed"], cwd=REPO_ROOT, capture_output=True, timeout=30
    )
    return "make --no-print-directory run" if up_to_date.returncode == 0 else ".venv/bin/homelab"


def wait_for_screen(session: str, wanted: tuple[str, ...], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", session)
        if all(text in screen for text in wanted):
            return screen
        time.sleep(0.25)
    raise AssertionError(f"the dashboard did not show {wanted!r}; the pane shows:\n{screen}")


def test_make_run_shows_the_dashboard_and_quits_with_q(tmp_path: Path) -> None:
    session = "smoke"
    fresh = {  # a fresh machine: no settings, no downloads (set in the command: a tmux
        # server does not pass its client's environment on)
        "HOMELAB_HOME": tmp_path / "home",
        "HF_HOME": tmp_path / "hf",
        "HF_HUB_OFFLINE": "1",
        "TERM": "xterm-256color",
    }
    assignments = " ".join(f"{name}={shlex.quote(str(value))}" for name, value in fresh.items())
    command = f"env {assignments} {run_command()}; tmux -L {SOCKET} wait-for -S done"
    tmux(
        "new-session",
        "-d",
        "-s",
        session,
        "-x",
        str(PANE_COLUMNS),
        "-y",
        str(PANE_ROWS),
        "-c",
        str(REPO_ROOT),
        command,
        check=True,
    )
    try:
        screen = wait_for_screen(session, ("homelab", "demo model"), STARTUP_TIMEOUT_S)
        assert "Hardware" in screen
        tmux("send-keys", "-t", session, "q")
        subprocess.run(["tmux", "-L", SOCKET, "wait-for", "done"], timeout=30, check=True)
    finally:
        tmux("kill-server")
