"""Never disturb a running server: the lock file a server holds, and the check benchmarks make.

A homelab server writes ``data_dir()/server.lock`` (JSON ``{"pid": ..., "url": ...}``) while
it runs — :func:`server_lock` does both the writing and the removing. ``homelab bench`` and
``homelab quality`` call :func:`refuse_if_server_running` first: measuring next to a live
server would slow down its users *and* give wrong figures, so they stop with an error that
says which server it is and what to do. A lock left behind by a crashed server (its process
is gone) is ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from homelab.errors import BenchError
from homelab.locations import data_dir, ensure_dir

LOCK_NAME = "server.lock"


@dataclass(frozen=True)
class ServerLock:
    pid: int
    url: str


def lock_path() -> Path:
    return data_dir() / LOCK_NAME


def read_server_lock(path: Path | None = None) -> ServerLock | None:
    """The lock's contents, or None when there is no lock or it cannot be read."""
    path = lock_path() if path is None else path
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return ServerLock(pid=int(document["pid"]), url=str(document.get("url", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running_server(path: Path | None = None) -> ServerLock | None:
    """The server that holds the lock, if its process is still alive."""
    lock = read_server_lock(path)
    if lock is None or not psutil.pid_exists(lock.pid):
        return None
    return lock


def refuse_if_server_running(what: str = "benchmark") -> None:
    """Raise :class:`BenchError` when a homelab server is running on this machine."""
    server = running_server()
    if server is None:
        return
    where = f" at {server.url}" if server.url else ""
    raise BenchError(
        f"a homelab server is running (pid {server.pid}{where}); a {what} now would slow "
        "down its users and measure a shared machine",
        hint=f"Stop the server first (its lock file is {lock_path()}), then run this again.",
    )


@contextmanager
def server_lock(url: str, pid: int | None = None) -> Iterator[Path]:
    """Hold the server lock for the duration of the block (for ``homelab serve``)."""
    path = ensure_dir(data_dir()) / LOCK_NAME
    mine = ServerLock(pid=os.getpid() if pid is None else pid, url=url)
    path.write_text(json.dumps({"pid": mine.pid, "url": mine.url}), encoding="utf-8")
    try:
        yield path
    finally:
        if read_server_lock(path) == mine:  # another server may have taken over the lock
            path.unlink(missing_ok=True)
