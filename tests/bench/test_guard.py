"""The server lock: benchmarks refuse to run next to a live server, and ignore a stale lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from homelab.errors import BenchError
from homelab.lock import lock_path, refuse_if_server_running, running_server, server_lock


def test_no_lock_means_no_server() -> None:
    lock_path().unlink(missing_ok=True)
    assert running_server() is None
    refuse_if_server_running()


def test_live_server_is_refused_with_its_pid_and_url() -> None:
    with server_lock("http://127.0.0.1:8080/v1") as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with pytest.raises(BenchError) as caught:
            refuse_if_server_running("quality run")
        message = str(caught.value)
        assert str(os.getpid()) in message and "http://127.0.0.1:8080/v1" in message
        assert "Stop the server" in message
    assert not lock_path().exists()


def test_lock_of_a_process_that_has_exited_is_ignored() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(finished.stdout)
    with server_lock("http://old", pid=dead_pid):
        assert running_server() is None
        refuse_if_server_running()


def test_unreadable_lock_is_ignored() -> None:
    lock_path().parent.mkdir(parents=True, exist_ok=True)
    lock_path().write_text("not json")
    try:
        assert running_server() is None
    finally:
        lock_path().unlink()
