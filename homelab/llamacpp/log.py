"""llama.cpp's log: captured per thread while a :func:`capture_log` block runs, else filtered.

llama.cpp logs through one process-wide callback. homelab installs its own (see ``_lib``):
lines are kept, per thread, by every :func:`capture_log` block active on that thread — the
dry run, the engine's loader and the quantizer parse sizes and reasons from them — and
otherwise warnings and errors go to Python logging while chatter is dropped, so the TUI's
terminal stays clean. Blocks nest: an outer block sees the lines of inner ones too, as they
arrive (the quantizer's progress reader polls its list while llama.cpp runs).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("homelab.llama")

_LEVELS = {  # ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5
    0: logging.CRITICAL,
    1: logging.DEBUG,
    2: logging.INFO,
    3: logging.WARNING,
    4: logging.ERROR,
}
_CONT = 5  # GGML_LOG_LEVEL_CONT: continues the previous line

_MEMORY_FAILURE = re.compile(
    r"out of memory|failed to allocate|unable to allocate|cudaMalloc|"
    r"ErrorOutOfDeviceMemory|not enough memory|insufficient memory|std::bad_alloc",
    re.IGNORECASE,
)
_PROBLEM = re.compile(r"error|fail|requir|unsupported|invalid|cannot|memory", re.IGNORECASE)

_local = threading.local()


def on_log(level: int, text: bytes | None, _user: object) -> None:
    """The callback llama.cpp calls for every log fragment (on the thread that logs)."""
    message = (text or b"").decode("utf-8", errors="replace")
    captures: list[list[str]] = getattr(_local, "captures", [])
    if captures:
        for lines in captures:
            if level == _CONT and lines:
                lines[-1] += message
            else:
                lines.append(message)
        return
    py_level = _LEVELS.get(level, logging.DEBUG)
    if py_level >= logging.WARNING:
        log.log(py_level, message.rstrip())


@contextmanager
def capture_log() -> Iterator[list[str]]:
    """Collect llama.cpp's log fragments emitted on this thread inside the block."""
    captures: list[list[str]] = getattr(_local, "captures", None) or []
    _local.captures = captures
    lines: list[str] = []
    captures.append(lines)
    try:
        yield lines
    finally:
        captures.remove(lines)


def joined(lines: list[str]) -> str:
    """The captured fragments as one text (fragments are not always whole lines)."""
    return "".join(lines)


def is_memory_failure(log_text: str) -> bool:
    """Whether llama.cpp's log says an allocation failed (stepping down may then help)."""
    return bool(_MEMORY_FAILURE.search(log_text))


def problem_lines(log_text: str, count: int = 4) -> str:
    """The last ``count`` log lines that say what went wrong, joined with `` | ``.

    llama.cpp often ends a failure with generic lines ("failed to load model"); the lines
    naming the cause (an allocation, a missing flash-attention requirement) come earlier.
    """
    lines = [line.strip() for line in log_text.splitlines() if line.strip(" .\n")]
    interesting = [
        line for line in lines if _PROBLEM.search(line) and "preferred buffer type" not in line
    ]
    return " | ".join((interesting or lines)[-count:]) or "llama.cpp logged nothing"


def last_line(log_text: str) -> str:
    """llama.cpp's last log line before giving up, which usually says why."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    return lines[-1] if lines else "llama.cpp logged nothing"
