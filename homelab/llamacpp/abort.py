"""When llama.cpp aborts: a lost RPC worker ends the engine that used it, not the process.

llama.cpp's RPC client has no error path. When a worker dies or drops the connection, the
thread talking to it (the RPC dispatcher's, or the engine's inside ``llama_decode``) calls
``GGML_ABORT``: ggml formats the message, calls the abort callback, then ``abort()`` — the
whole process dies, every request of every model with it. ggml lets us choose what happens
*before* ``abort()``, and a callback that never returns means it never comes:

- a message from ``ggml-rpc.cpp`` while someone :func:`watch` es (an engine over workers):
  each watcher hears it once, then the calling thread is parked forever. It releases the GIL
  while it waits; the engine's scheduler thread stays blocked inside ``llama_decode`` (it
  waits for that parked thread), so the engine must never free, join or call into its
  llama.cpp objects again — it leaks them and reports itself failed.
- any other message (a genuine bug), or an RPC failure nobody watches (a load): printed to
  stderr, then the abort goes ahead, loudly, as without us.

The callback is set in the ggml copy llama.cpp really links (``libggml-base.so.0``, see
``_lib.ggml_library``) and only once RPC workers are in use (:func:`install`).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from homelab.llamacpp._lib import ggml_library
from homelab.llamacpp.lane import replace_stuck_lane

RPC_SOURCE = "ggml-rpc.cpp"  # ggml prefixes every abort message with FILE:LINE

_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_callback: Any = None  # kept alive for as long as ggml may call it (any thread, any time)
_watchers: list[Callable[[str], None]] = []
_lock = threading.Lock()
_heard: list[str] = []  # every RPC abort message, in order (the first is the one reported)


def is_rpc_failure(message: str) -> bool:
    """Whether an abort message comes from llama.cpp's RPC client (a worker, not a bug here)."""
    return RPC_SOURCE in message


def install() -> None:
    """Set homelab's abort callback in ggml (idempotent; call it once workers are in use)."""
    global _callback
    with _lock:
        if _callback is not None:
            return
        base = ggml_library("ggml-base")
        base.ggml_set_abort_callback.restype = ctypes.c_void_p
        base.ggml_set_abort_callback.argtypes = [_ABORT_CALLBACK]
        _callback = _ABORT_CALLBACK(_on_abort)
        base.ggml_set_abort_callback(_callback)


def watch(watcher: Callable[[str], None]) -> Callable[[], None]:
    """Call ``watcher(message)`` on the aborting thread when an RPC worker is lost (once);
    returns the function that stops watching."""
    install()
    with _lock:
        _watchers.append(watcher)

    def unwatch() -> None:
        with _lock:
            if watcher in _watchers:
                _watchers.remove(watcher)

    return unwatch


def _on_abort(raw: bytes | None) -> None:
    message = (raw or b"").decode("utf-8", errors="replace").strip()
    rpc = is_rpc_failure(message)
    with _lock:
        watchers = list(_watchers) if rpc else []
        survive = rpc and bool(watchers or _heard)  # later RPC aborts of a lost engine too
        if survive:
            _watchers.clear()
            _heard.append(message)
    if not survive:
        _report_and_abort(message)
        return
    for watcher in watchers:  # each hears one loss: its engine is failed from now on
        try:
            watcher(message)
        except Exception:  # a watcher's bug must not let abort() through
            traceback.print_exc()
    replace_stuck_lane()  # the lane's decode waits on this thread: the other engines go on
    _park()


def _report_and_abort(message: str) -> None:
    sys.stderr.write(f"llama.cpp aborted: {message}\n")
    if is_rpc_failure(message):
        sys.stderr.write(
            "homelab: lost an RPC worker while no engine was using it (during a load?): "
            "llama.cpp cannot continue, so this process ends. Restart the worker, then this "
            "command.\n"
        )
    sys.stderr.flush()


def _park() -> None:
    """Never return (returning lets ``abort()`` end the process); the GIL is released."""
    threading.Event().wait()
