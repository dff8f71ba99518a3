"""One OS thread for every ``llama_decode`` of the process: the compute lane.

The CPU backend of llama.cpp runs each graph on an OpenMP team (the wheel links libgomp).
libgomp keeps one team of worker threads *per calling thread* for as long as that thread
lives, and once the process holds more of those threads than there are CPUs it stops spinning
at barriers and sleeps on a futex instead — ggml meets a barrier at every graph node, so
decode slows down by half or more. Measured on 2 cores (F16 124M demo model, 1 stream): 164
tok/s with one engine; 75 tok/s once a second engine had run a single decode on its own
scheduler thread — although it was idle again. The fleet (several models), the embeddings
context beside a chat model and the speculation benchmark all have several contexts, each
driven from its own thread.

So every decode of every context goes through :func:`decode_on_lane`, which runs it on one
long-lived thread (one OpenMP team, whatever the number of engines): a hand-off costs tens of
microseconds per step, against milliseconds of compute. Calls from the lane thread itself run
directly.

A lost RPC worker parks the thread that calls llama.cpp's abort (see ``abort``) and leaves the
lane's decode blocked for good; :func:`replace_stuck_lane` gives the other engines a fresh lane
thread (the stuck one leaks, like the failed engine's context).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Call:
    function: Callable[[], Any]
    done: threading.Lock = field(default_factory=threading.Lock)
    result: Any = None
    error: BaseException | None = None


class ComputeLane:
    """A daemon thread that runs the calls given to :meth:`run`, one at a time, in order."""

    def __init__(self, name: str = "llama.cpp compute lane") -> None:
        self._name = name
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, function: Callable[[], Any]) -> Any:
        """``function()`` on the lane thread; its result, or its exception raised here."""
        thread = self._thread
        if thread is threading.current_thread():
            return function()
        if thread is None:
            self._start()
        call = _Call(function)
        call.done.acquire()
        self._calls.put(call)
        call.done.acquire()  # released by the lane when the call has run
        if call.error is not None:
            raise call.error
        return call.result

    def replace(self) -> None:
        """A new lane thread takes the queue (the current one is stuck inside llama.cpp)."""
        self._start(replace=True)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _start(self, *, replace: bool = False) -> None:
        with self._lock:
            if self._thread is not None and not replace:
                return
            thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread = thread
            thread.start()

    def _serve(self) -> None:
        me = threading.current_thread()
        while self._thread is me:
            call = self._calls.get()
            if self._thread is not me:  # replaced while waiting: hand the call on
                self._calls.put(call)
                return
            try:
                call.result = call.function()
            except BaseException as exc:  # handed to the caller, raised there
                call.error = exc
            call.done.release()


_LANE = ComputeLane()


def decode_on_lane(decode: Callable[[], int]) -> int:
    """Run one llama.cpp decode (or encode) on the process's compute lane."""
    return int(_LANE.run(decode))


def replace_stuck_lane() -> None:
    """Called when a decode will never return (a lost RPC worker): the others go on."""
    _LANE.replace()
