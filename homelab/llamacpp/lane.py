"""One OS thread for every ``llama_decode`` of the process: the compute lane.

The CPU backend of llama.cpp runs each graph on an OpenMP team (the wheel links libgomp).
libgomp keeps one team of worker threads *per calling thread* for as long as that thread
lives, and once the process holds more of those threads than there are CPUs it stops spinning
at barriers and sleeps on a futex instead — ggml meets a barrier at every graph node, so
decode slows down by half or more. Measured on 2 cores (F16 124M demo model, 1 stream): 164
tok/s with one engine; 75 tok/s once a second engine had run a single decode on its own
scheduler thread — although it was idle again. The fleet (several models), the embeddings
context beside a chat model and the speculation benchmark all have several contexts.

So every decode of every context runs on one long-lived thread (one OpenMP team, whatever
the number of engines). That thread also *runs the engines*: each engine's scheduler is a
:class:`Resident` of the lane, stepped in turn, so an engine's ``llama_decode`` is a direct
call, with no hand-off between threads. A hand-off costs two wake-ups per step, and on a
machine whose cores are busy with ggml's spinning OpenMP workers the woken thread waits for a
core: on the tiny demo model (~0.3 ms a step) decoding through a hand-off ran at 0.65x the
speed of the direct call. Other callers (an embedding model's worker, a quality run)
hand their decode to the lane with :func:`decode_on_lane` and wait for it.

A lost RPC worker parks the thread that calls llama.cpp's abort (see ``abort``) and leaves the
lane's decode blocked for good; :func:`replace_stuck_lane` gives the other engines a fresh lane
thread (the stuck one leaks, like the failed engine's context).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

log = logging.getLogger("homelab.llamacpp")
T = TypeVar("T")


@dataclass
class _Call:
    function: Callable[[], Any]
    done: threading.Lock = field(default_factory=threading.Lock)
    result: Any = None
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.function()
        except BaseException as exc:  # handed to the caller, raised there
            self.error = exc
        self.done.release()


class Resident(Protocol):
    """Work the lane thread runs in turn with the others (an engine's scheduler)."""

    def run_once(self) -> float | None:
        """Do one step if there is work and return 0.0; when idle return the seconds until
        it wants to run again (its metrics are due), or ``inf`` to wait for a wake-up;
        None once it is finished (the lane forgets it)."""


class ComputeLane:
    """A daemon thread that runs its residents' steps and the calls given to :meth:`run`."""

    def __init__(self, name: str = "llama.cpp compute lane") -> None:
        self._name = name
        self._cv = threading.Condition()
        self._calls: deque[_Call] = deque()
        self._residents: list[Resident] = []
        self._stepping: tuple[Resident, ...] = ()  # _residents as the lane last took them
        # the one resident that had work at the last round, every other waiting for a wake
        # or a time (None: none or several), and the first of those times (perf_counter)
        self._solo: Resident | None = None
        self._solo_until = 0.0
        self._woken = False  # a wake() since the lane last looked for work
        self._thread: threading.Thread | None = None
        self._ident = 0  # the lane thread's ident once it runs (0: none yet, never a thread's)

    def run(self, function: Callable[[], Any]) -> Any:
        """``function()`` on the lane thread; its result, or its exception raised here."""
        if self.is_current():
            return function()
        call = _Call(function)
        call.done.acquire()
        with self._cv:
            self._calls.append(call)
            self._ensure_started()
            self._cv.notify()
        call.done.acquire()  # released by the lane when the call has run
        if call.error is not None:
            raise call.error
        return call.result

    def attach(self, resident: Resident) -> None:
        """Step ``resident`` on the lane from now on, until its ``run_once`` returns None."""
        with self._cv:
            self._residents.append(resident)
            self._ensure_started()
            self._woken = True
            self._cv.notify()

    def wake(self) -> None:
        """A resident has new work (or is closing): look at it soon. Any thread."""
        with self._cv:
            self._woken = True
            self._cv.notify()

    def replace(self) -> None:
        """A new lane thread takes the calls and residents (the current one is stuck
        inside llama.cpp)."""
        with self._cv:
            self._start()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def is_current(self) -> bool:
        """Whether the calling thread is the lane (a C call and a compare: every step asks)."""
        return self._ident == threading.get_ident()

    def _ensure_started(self) -> None:
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
        self._thread = thread
        thread.start()

    def _serve(self) -> None:
        me = threading.current_thread()
        self._ident = threading.get_ident()
        while self._thread is me:
            calls, residents = self._take_work()
            for index, call in enumerate(calls):
                if self._thread is not me:  # replaced while a call was stuck: hand on the rest
                    self._give_back(calls[index:])
                    return
                call.run()
            wait_s = self._step_residents(residents, me)
            if wait_s is None:
                return
            if not calls and wait_s > 0:
                self._sleep(wait_s)

    def _step_residents(
        self, residents: tuple[Resident, ...], me: threading.Thread
    ) -> float | None:
        """One ``run_once`` of each resident; the seconds until one wants to run again (None:
        this thread was replaced meanwhile). Notes which resident, if only one, has work."""
        wait_s, busy, others_until = math.inf, [], math.inf
        for resident in residents:
            if self._thread is not me:
                return None
            try:
                resident_wait_s = resident.run_once()
            except Exception:  # a resident's bug must not stop the others
                log.exception("a compute-lane resident failed; it is dropped")
                resident_wait_s = None
            if resident_wait_s is None:
                wait_s = self._drop(resident)
                continue
            if resident_wait_s <= 0:
                busy.append(resident)
            elif resident_wait_s < math.inf:
                others_until = min(others_until, time.perf_counter() + resident_wait_s)
            wait_s = min(wait_s, resident_wait_s)
        self._solo = busy[0] if len(busy) == 1 else None
        self._solo_until = others_until
        return wait_s

    def _give_back(self, calls: list[_Call]) -> None:
        with self._cv:
            self._calls.extendleft(reversed(calls))
            self._cv.notify()

    def _take_work(self) -> tuple[list[_Call], tuple[Resident, ...]]:
        if not self._calls and not self._woken:  # nothing new: no lock (a writer that comes
            return [], self._stepping  # now is seen by _sleep, which looks under the lock)
        with self._cv:
            calls = list(self._calls)
            self._calls.clear()
            self._woken = False
            self._stepping = tuple(self._residents)
            return calls, self._stepping

    def _drop(self, resident: Resident) -> float:
        """Forget a resident that has finished (or failed); 0.0: look for work again."""
        with self._cv:
            if resident in self._residents:
                self._residents.remove(resident)
            self._stepping = tuple(self._residents)
        return 0.0

    def _sleep(self, wait_s: float) -> None:
        with self._cv:
            if self._calls or self._woken:
                return
            self._cv.wait(None if math.isinf(wait_s) else wait_s)


_LANE = ComputeLane()


def decode_on_lane(decode: Callable[..., Any], *args: Any) -> int:
    """``decode(*args)``, one llama.cpp decode (or encode), on the process's compute lane:
    a direct call when the lane itself asks (an engine's step, every token), else handed to
    it."""
    if _LANE._ident == threading.get_ident():  # is_current(), inline: every token asks
        return int(decode(*args))
    return int(_LANE.run(lambda: decode(*args)))


def alone(resident: Resident, now: float) -> bool:
    """Whether ``resident``, stepping on the lane, may take its next step at once without
    going back to the lane: at the lane's last round it was the only resident with work (the
    others, idle engines, wait for a wake or a time — ``now``, ``perf_counter``, is before
    it), and nobody has handed the lane a call or a wake since. Read without the lock: a
    call or wake that comes now is seen after the next step."""
    lane = _LANE
    return lane._solo is resident and now < lane._solo_until and not lane._calls and not lane._woken


def run_on_lane(function: Callable[[], T]) -> T:
    """Run other llama.cpp compute (a vision projector's encode) on the compute lane."""
    result: T = _LANE.run(function)
    return result


def attach(resident: Resident) -> None:
    """Step ``resident`` (an engine's scheduler) on the process's compute lane."""
    _LANE.attach(resident)


def wake() -> None:
    """Tell the lane a resident has work."""
    _LANE.wake()


def on_lane() -> bool:
    """Whether the calling thread is the compute lane."""
    return _LANE.is_current()


def replace_stuck_lane() -> None:
    """Called when a decode will never return (a lost RPC worker): the others go on."""
    _LANE.replace()
