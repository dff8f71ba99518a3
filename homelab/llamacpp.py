"""The doorway to llama-cpp-python's process-wide state: lazy import and log capture.

llama.cpp logs through one process-wide callback. homelab installs its own: lines are
kept (per thread) while a :func:`capture_log` block is active on that thread — the planner's
dry run and the engine parse buffer sizes from them — and otherwise warnings and errors go
to Python logging while chatter is dropped, so the TUI's terminal stays clean.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

log = logging.getLogger("homelab.llama")

_LEVELS = {  # ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5
    0: logging.CRITICAL,
    1: logging.DEBUG,
    2: logging.INFO,
    3: logging.WARNING,
    4: logging.ERROR,
}
_CONT = 5  # GGML_LOG_LEVEL_CONT: continues the previous line

_local = threading.local()
_install_lock = threading.Lock()
_callback: Any = None  # kept alive for as long as llama.cpp may call it


def _on_log(level: int, text: bytes | None, _user: object) -> None:
    message = (text or b"").decode("utf-8", errors="replace")
    captured: list[str] | None = getattr(_local, "lines", None)
    if captured is not None:
        if level == _CONT and captured:
            captured[-1] += message
        else:
            captured.append(message)
        return
    py_level = _LEVELS.get(level, logging.DEBUG)
    if py_level >= logging.WARNING:
        log.log(py_level, message.rstrip())


def llama() -> ModuleType:
    """Import llama_cpp (slow the first time) with homelab's log handling installed."""
    global _callback
    import llama_cpp

    with _install_lock:
        if _callback is None:
            _callback = llama_cpp.llama_log_callback(_on_log)
            llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
    return llama_cpp


@contextmanager
def capture_log() -> Iterator[list[str]]:
    """Collect llama.cpp's log lines emitted on this thread inside the block."""
    llama()
    previous = getattr(_local, "lines", None)
    lines: list[str] = []
    _local.lines = lines
    try:
        yield lines
    finally:
        _local.lines = previous


def joined(lines: list[str]) -> str:
    """The captured fragments as one text (fragments are not always whole lines)."""
    return "".join(lines)
