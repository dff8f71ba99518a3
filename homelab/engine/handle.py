"""The reader hand-off: what a caller holds for a submitted request, and how it is woken.

The scheduler (on the compute lane) pushes each request's events into its
:class:`RequestHandle`; the caller reads them in one of five ways:

- blocking, in a thread: ``for event in handle`` (one by one), :meth:`RequestHandle.chunks`
  (in lists, at most every ``READ_INTERVAL_S``: what a terminal or a screen shows) or
  :meth:`RequestHandle.collect` (the whole :class:`Completion`, woken once at the end);
- in asyncio: :meth:`RequestHandle.events` (each as it comes: streaming responses) or
  :meth:`RequestHandle.all_events` (every event at once: whole responses).

What a wake costs decides the design. Waking an asyncio reader costs its event loop a
self-pipe write and a turn (~30 µs, which on two cores the decoding thread waits for: at the
tiny models' 0.3 ms steps, every token), so a reader is woken only when it is parked waiting,
a whole-response reader only at the finish, and the asyncio readers a step gave events are
woken together when the step ends (:class:`LoopWakes`: one ``call_soon_threadsafe`` per event
loop per step, not one per streaming request; eight streams on one loop: 8x fewer wakes). A
thread woken per token takes a core from the decode on a small machine, hence ``chunks``.
tests/engine/test_step_overhead.py and tests/server/test_stream_overhead.py count these.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass

from homelab.engine.api import FinishEvent, TokenEvent, TokenLogprob

# a reader of RequestHandle.chunks takes what has come this often while tokens flow (50 Hz:
# a terminal or a screen shows no more)
READ_INTERVAL_S = 0.02

Event = TokenEvent | FinishEvent


@dataclass(frozen=True)
class Completion:
    """A whole request's result, for callers that do not stream."""

    text: str
    token_ids: tuple[int, ...]
    finish: FinishEvent
    logprobs: tuple[TokenLogprob | None, ...] = ()

    @classmethod
    def of(cls, events: Sequence[Event]) -> Completion:
        """The completion a request's whole event stream (ending with its finish) makes."""
        *body, finish = events
        assert isinstance(finish, FinishEvent), "a request stream always ends with a FinishEvent"
        tokens = [event for event in body if isinstance(event, TokenEvent)]
        return cls(
            "".join(event.text for event in tokens),
            tuple(event.token_id for event in tokens),
            finish,
            tuple(event.logprob for event in tokens),
        )


class LoopWakes:
    """The asyncio readers one scheduler step has given events, woken together when the step
    ends: one ``call_soon_threadsafe`` (a self-pipe write, a turn of the loop) per event loop
    per step, not one per streaming request."""

    def __init__(self) -> None:
        # the thread running a step (its pushes are gathered), else 0: a push from any other
        # thread (a failure declared while the lane is stuck) wakes its reader at once
        self.gathering_thread = 0
        # the readers gathered since the last wake, by event loop (empty: nobody to wake)
        self.gathered: dict[asyncio.AbstractEventLoop, list[RequestHandle]] = {}
        # perf_counter of a steady step's last wake: the next wakes no sooner than
        # STREAM_WAKE_INTERVAL_S after it; a step that ends on the lane wakes whoever was
        # gathered (flush)
        self.last_steady_wake = 0.0

    def add(self, loop: asyncio.AbstractEventLoop, handle: RequestHandle) -> None:
        self.gathered.setdefault(loop, []).append(handle)

    def flush(self) -> None:
        """Stop gathering and wake every reader gathered."""
        self.gathering_thread = 0
        if self.gathered:
            self.wake_gathered()

    def wake_gathered(self) -> None:
        """Wake every reader gathered so far; gathering goes on (steady steps)."""
        by_loop, self.gathered = self.gathered, {}
        for loop, handles in by_loop.items():
            try:
                loop.call_soon_threadsafe(_wake_all, handles)
            except RuntimeError:  # that loop has closed: its readers are gone
                continue


def _wake_all(handles: list[RequestHandle]) -> None:
    for handle in handles:
        handle._set_async_wake()


class RequestHandle:
    """A submitted request and its event stream (consumed once).

    Read it in a thread (``for event in handle``, :meth:`chunks`, :meth:`collect`) or in
    asyncio (:meth:`events`, :meth:`all_events`): it yields :class:`TokenEvent` items, then
    exactly one :class:`FinishEvent`. Call :meth:`cancel` to stop early. Leaving a *blocking*
    loop does not cancel (iterate again to resume). An asyncio iteration that ends early —
    its task cancelled (a client disconnected), the iterator closed or dropped — cancels the
    request; servers should still call :meth:`cancel` in a ``finally`` to free the slot at
    once.
    """

    def __init__(
        self,
        request_id: str,
        wake_scheduler: Callable[[], None],
        wakes: LoopWakes | None = None,
    ) -> None:
        self.request_id = request_id
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._wake_scheduler = wake_scheduler
        self._wakes = wakes  # the scheduler's wakes, gathered per step
        self.cancelled = False
        self.finished = False  # set by the scheduler before it sends the FinishEvent
        self._consumed = False  # the FinishEvent has been handed to the consumer
        self._loop: asyncio.AbstractEventLoop | None = None
        # the future an asyncio consumer is parked on, while it waits for an event (one per
        # wait: an asyncio.Event's wait and set cost the loop ~8 more calls a token)
        self._parked: asyncio.Future[None] | None = None
        # the asyncio consumer is parked (set by it, cleared by `push`)
        self._async_waiting = False
        self._wake_at_finish = False  # park until the FinishEvent (whole-response readers)
        self._ended = threading.Event()  # the FinishEvent is queued (collect() waits for it)

    def cancel(self) -> None:
        """Stop generating; the slot is freed at the next step. Safe from any thread."""
        if not self.finished:
            self.cancelled = True
            self._wake_scheduler()

    def has_queued(self) -> bool:
        """Whether an event waits to be read: the reader's next one comes without a wait
        (a streaming response then sends what it has with what comes next)."""
        return not self._events.empty()

    # called on the compute lane (the scheduler's step)
    def push(self, event: TokenEvent) -> None:
        """Queue a token; wake an asyncio consumer only if it is parked waiting for one (a
        wake-up costs the loop a self-pipe write and a turn: once per token otherwise) and
        it reads token by token (a whole-response reader is woken at the finish)."""
        self._events.put(event)
        if self._async_waiting and not self._wake_at_finish:
            self._wake_async()

    def push_finish(self, event: FinishEvent) -> None:
        """Queue the request's last event and wake whoever waits for it."""
        self._events.put(event)
        self._ended.set()
        if self._async_waiting:
            self._wake_async()

    def _wake_async(self) -> None:
        self._async_waiting = False
        loop = self._loop
        if loop is None:
            return
        if self._wakes is not None and self._wakes.gathering_thread == threading.get_ident():
            self._wakes.add(loop, self)  # woken with the step's other readers on this loop
            return
        try:
            loop.call_soon_threadsafe(self._set_async_wake)
        except RuntimeError:  # the consumer's loop has closed
            self._loop = None

    def _set_async_wake(self) -> None:
        parked = self._parked
        if parked is not None and not parked.done():
            parked.set_result(None)

    def _deliver(self, event: Event) -> Event:
        if isinstance(event, FinishEvent):
            self._consumed = True
        return event

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        if self._consumed:
            raise StopIteration
        return self._deliver(self._events.get())

    def chunks(self, interval_s: float = READ_INTERVAL_S) -> Iterator[list[Event]]:
        """The events in lists, for a thread that shows them (a terminal, a screen): the
        first event after a pause wakes the reader at once; while tokens flow, the reader
        takes what has come every ``interval_s`` instead of being woken for each token. A
        thread woken per token takes a core from the decode on a small machine (2 cores:
        see benchmarks/RESULTS.md). The last list ends with the FinishEvent."""
        while not self._consumed:
            events = [self._deliver(self._events.get())]
            while not self._consumed:
                try:
                    events.append(self._deliver(self._events.get_nowait()))
                except queue.Empty:
                    break
            yield events
            if not self._consumed:
                time.sleep(interval_s)

    async def events(self) -> AsyncIterator[Event]:
        """The events in asyncio, each as it comes (the consumer's loop is woken for a token
        only when it is parked waiting for one). Per token, the loop's own work is what a
        streaming response pays on top of its decode: an event already queued is taken
        without a further call (tests/server/test_stream_overhead.py counts them)."""
        loop = self._start_async(at_finish=False)
        queued = self._events
        try:
            while not self._consumed:
                event = queued.get_nowait() if not queued.empty() else await self._next_async(loop)
                if isinstance(event, FinishEvent):
                    self._consumed = True
                yield event
        finally:
            if not self._consumed:  # cancelled while waiting, closed, or abandoned
                self.cancel()

    async def all_events(self) -> list[Event]:
        """Every event, once the request has ended, in one list ending with the FinishEvent:
        the consumer's loop is woken once, at the end, for callers that answer with the
        whole response (woken per token, a non-streamed request would cost the loop a turn
        each; read one by one, a generator hop each)."""
        loop = self._start_async(at_finish=True)
        events: list[Event] = []
        try:
            while not self._consumed:
                events.append(await self._next_async(loop))
                while not isinstance(events[-1], FinishEvent):
                    try:
                        events.append(self._events.get_nowait())
                    except queue.Empty:
                        break
                self._consumed = isinstance(events[-1], FinishEvent)
            return events
        finally:
            if not self._consumed:  # cancelled while waiting
                self.cancel()

    def _start_async(self, *, at_finish: bool) -> asyncio.AbstractEventLoop:
        """The reader's event loop, which ``push`` wakes from now on."""
        self._wake_at_finish = at_finish
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def _next_async(self, loop: asyncio.AbstractEventLoop) -> Event:
        """The next event, parking on a fresh future of ``loop`` while none is queued."""
        queued = self._events
        while queued.empty():
            parked = self._parked = loop.create_future()
            self._async_waiting = True
            # an event pushed before the flag was set is seen here; later ones wake us
            if not queued.empty():
                self._async_waiting = False
                break
            try:
                await parked
            finally:
                self._async_waiting = False
                self._parked = None
        return queued.get_nowait()

    def collect(self) -> Completion:
        """Block until the request ends; return its text, tokens and finish event. The
        thread is woken once, at the end (not per token: see :meth:`chunks`)."""
        self._ended.wait()
        return Completion.of(list(self))
