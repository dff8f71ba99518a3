"""Continuous batching: one ``llama_decode`` per step, every sequence in it, on the lane.

Each step the scheduler

1. drops cancelled requests (their slot is free for this very step),
2. places waiting requests in free slots (tenant-isolated prefix cache, see ``slots``),
3. builds one ``llama_batch``: one token for every generating sequence, then prefill chunks
   of prompts still being read — at most ``prefill_chunk_tokens`` per step while others are
   generating, so a long prompt never stalls everyone else's tokens for long,
4. calls ``llama_decode`` once, and
5. samples every sequence that needs a token from its own logits row with its own C sampler
   chain, turns tokens into text (complete UTF-8 only, stop strings held back) and hands
   events to the request handles.

With speculation (``homelab.engine.speculation``) a generating sequence may bring a draft:
its row becomes ``[last, d0 … dk-1]`` with logits at every position, in the same
``llama_decode`` as everyone else; the target's sampler keeps the agreeing prefix
(``homelab.engine.speculation.acceptance``), the rejected positions are dropped from the
cache, and the kept tokens are emitted one by one through the same path as a plain token — so a stop
string, max_tokens, an end-of-generation token or a cancellation in the middle of an
accepted draft ends the stream exactly where plain decoding would.

Requests join at the next step and leave the moment they finish. If ``llama_decode`` fails,
the step is rolled back and each sequence retried on its own, so only the request that
really fails gets an error; any Python error while handling one request fails that request,
never the engine.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from homelab.engine.api import (
    FinishEvent,
    FinishReason,
    GenerationRequest,
    TokenEvent,
    TokenLogprob,
    new_token_event,
)
from homelab.engine.image_prefill import ImagePrefill, JobImages
from homelab.engine.image_prompt import ImagePrompt, ImageSpan
from homelab.engine.metrics import PER_TOKEN_PHASES, EngineMeter, RequestClock, StepProfile
from homelab.engine.sampling import SamplerChain, top_logprobs
from homelab.engine.slots import Slot, SlotTable
from homelab.engine.speculation.acceptance import verify
from homelab.engine.speculation.sequence import DraftRequest, SequenceSpeculation
from homelab.engine.speculation.speculator import Speculator
from homelab.engine.text import StopMatcher, Utf8Decoder
from homelab.llamacpp import lane
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context
from homelab.llamacpp.vocab import Vocab

# a reader of RequestHandle.chunks takes what has come this often while tokens flow (50 Hz:
# a terminal or a screen shows no more)
READ_INTERVAL_S = 0.02
# while the same sequences step again and again, their asyncio readers are woken at most this
# often, and take what has come meanwhile at once: a wake costs the event loop ~30 µs, which on
# two cores the decoding threads wait for — at the tiny models' 0.3 ms steps, every token. At a
# GPU's step times (1 ms and more) every token still wakes its reader when it comes; what a
# reader does not yet know waits at most this long and one step (vLLM's --stream-interval
# makes the same trade in tokens)
STREAM_WAKE_INTERVAL_S = 0.001

log = logging.getLogger("homelab.engine")

Event = TokenEvent | FinishEvent
T = TypeVar("T")


# --- what callers hold -------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """A whole request's result, for callers that do not stream."""

    text: str
    token_ids: tuple[int, ...]
    finish: FinishEvent
    logprobs: tuple[TokenLogprob | None, ...] = ()


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

    Iterate it in a thread (``for event in handle``) or in asyncio (``async for``): it yields
    :class:`TokenEvent` items, then exactly one :class:`FinishEvent`. Call :meth:`cancel` to
    stop early. Leaving a *blocking* loop does not cancel (iterate again to resume). An
    asyncio iteration that ends early — its task cancelled (a client disconnected), the
    iterator closed or dropped — cancels the request; servers should still call
    :meth:`cancel` in a ``finally`` to free the slot at once.
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

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.events()

    async def events(self) -> AsyncIterator[Event]:
        """The events in asyncio, each as it comes (the consumer's loop is woken for a token
        only when it is parked waiting for one). Per token, the loop's own work is what a
        streaming response pays on top of its decode: an event already queued is taken
        without a further call (tests/server/test_stream_overhead.py counts them)."""
        self._start_async(at_finish=False)
        queued = self._events
        try:
            while not self._consumed:
                event = queued.get_nowait() if not queued.empty() else await self._next_async()
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
        self._start_async(at_finish=True)
        events: list[Event] = []
        try:
            while not self._consumed:
                events.append(await self._next_async())
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

    def _start_async(self, *, at_finish: bool) -> None:
        self._wake_at_finish = at_finish
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    async def _next_async(self) -> Event:
        """The next event, parking on a fresh future while none is queued."""
        queued = self._events
        while queued.empty():
            parked = self._parked = self._loop.create_future()  # type: ignore[union-attr]
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
        return _completion(list(self))

    async def collect_async(self) -> Completion:
        return _completion(await self.all_events())


def _completion(events: Sequence[Event]) -> Completion:
    *body, finish = events
    assert isinstance(finish, FinishEvent), "a request stream always ends with a FinishEvent"
    tokens = [event for event in body if isinstance(event, TokenEvent)]
    return Completion(
        "".join(event.text for event in tokens),
        tuple(event.token_id for event in tokens),
        finish,
        tuple(event.logprob for event in tokens),
    )


# --- the scheduler's view of a request ---------------------------------------------------


@dataclass(eq=False)
class Job:
    request: GenerationRequest
    handle: RequestHandle
    prompt: list[int]
    chain: SamplerChain
    clock: RequestClock
    slot: Slot | None = None
    n_past: int = 0  # this sequence's positions in the KV cache
    prompt_pos: int = 0  # next prompt token to evaluate
    last_token: int = -1  # sampled, evaluated at the next step
    batch_index: int = -1  # the batch row whose logits this job samples
    utf8: Utf8Decoder = field(default_factory=Utf8Decoder)
    stop: StopMatcher | None = None
    spec: SequenceSpeculation | None = None  # set at admission when the engine speculates
    images: JobImages | None = None  # a prompt with images (see image_prefill)
    # the request's sampling fields read for every token, copied once
    max_tokens: int = field(init=False)
    ignore_eos: bool = field(init=False)
    wants_logprobs: bool = field(init=False)
    # end-of-generation is banned while fewer tokens came (a grammar that has finished
    # allows nothing else, so never under a grammar)
    min_tokens: int = field(init=False)
    # its tokens are text alone: no stop strings to look for, no log-probabilities
    plain_text: bool = field(init=False)

    def __post_init__(self) -> None:
        sampling = self.request.sampling
        self.plain_text = self.stop is None and sampling.logprobs is None
        self.max_tokens = sampling.max_tokens
        self.ignore_eos = sampling.ignore_eos
        self.wants_logprobs = sampling.logprobs is not None
        self.min_tokens = 0 if sampling.grammar else sampling.min_tokens


@dataclass
class _Part:
    """One job's tokens in this step's batch."""

    job: Job
    start_pos: int
    tokens: list[int]
    sample: bool  # take logits for the last token and sample after the decode
    prefill: bool
    draft: tuple[int, ...] = ()  # drafted tokens (tokens = [last, *draft]): verify them
    first_row: int = -1


@dataclass(frozen=True)
class SchedulerConfig:
    n_batch: int
    n_vocab: int
    n_ctx_per_slot: int
    prefill_chunk_tokens: int
    queue_limit: int


class Scheduler:
    """Owns the llama.cpp context after loading; every step runs on the compute lane.

    The scheduler has no thread of its own: it is a resident of the process's compute lane
    (``homelab.llamacpp.lane``), which calls :meth:`run_once` in turn with the other engines'
    schedulers, so ``llama_decode`` is a direct call. Other threads only queue work (under
    ``_lock``) and wake the lane."""

    def __init__(
        self,
        context: Context,
        vocab: Vocab,
        slots: SlotTable,
        meter: EngineMeter,
        config: SchedulerConfig,
        eog_tokens: frozenset[int],
        speculator: Speculator | None = None,
        profile: StepProfile | None = None,
        images: ImagePrefill | None = None,
    ) -> None:
        self._context = context
        self._profile = profile  # time every step's phases (debug metrics), or not at all
        self._speculator = speculator
        self._vocab = vocab
        self._slots = slots
        self._meter = meter
        self.config = config
        self._eog = eog_tokens
        self._eog_ids = np.fromiter(sorted(eog_tokens), dtype=np.int64, count=len(eog_tokens))
        self._lock = threading.Lock()  # guards _incoming, _calls, _closing, _n_queued
        self._incoming: deque[Job] = deque()
        self._waiting: deque[Job] = deque()
        self._prefilling: list[Job] = []
        self._decoding: list[Job] = []  # in slot order (see _plan_batch)
        self._n_queued = 0  # incoming + waiting, for the queue bound (guarded by _lock)
        self._cancel_noted = False  # a handle was cancelled since the last look
        self.wakes = LoopWakes()  # the asyncio readers to wake when a step ends
        self._closing = False
        self.failure: str | None = None  # set by fail(): this context can never compute again
        self._calls: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self._pieces: dict[int, bytes] = {}
        self._whole_texts: dict[int, str] = {}  # see piece()
        self._batch = Batch(config.n_batch)
        self._stopped = threading.Event()  # set on the lane once the scheduler has shut down
        self._shut_down = False  # the same, read by every step (a plain attribute is cheaper)
        self._images = images  # the vision projector's side, when the model has one
        self._image_steps: list[tuple[Job, ImageSpan, int]] = []  # planned for this step
        if profile is not None:  # the per-token parts of emitting, timed (StepProfile)
            self._detokenize = profile.timing("detokenize", self._detokenize)  # type: ignore[method-assign]
            self._match_stops = profile.timing("stop", self._match_stops)  # type: ignore[method-assign]
            self._hand_over = profile.timing("handoff", self._hand_over)  # type: ignore[method-assign]

    def start(self) -> None:
        lane.attach(self)

    # --- called from other threads -------------------------------------------------------

    def enqueue(self, job: Job) -> bool:
        """Queue a job; False when the queue is full (the caller raises BusyError)."""
        with self._lock:
            if self._closing or self._n_queued >= self.config.queue_limit:
                return False
            self._n_queued += 1
            self._incoming.append(job)
        lane.wake()
        return True

    def call_between_steps(self, function: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``function`` on the engine thread between two steps (it may touch llama.cpp)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("the engine is closed")
            self._calls.append((function, future))
        lane.wake()
        return future

    def _run_calls(self) -> None:
        while self._calls:
            with self._lock:
                function, future = self._calls.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:
                    future.set_exception(exc)

    def wake(self) -> None:
        lane.wake()

    def cancel_noted(self) -> None:
        """A request handle was cancelled (any thread): look for cancellations next step."""
        self._cancel_noted = True
        lane.wake()

    @property
    def queue_depth(self) -> int:
        """Requests submitted but not yet in a slot."""
        return self._n_queued

    @property
    def closing(self) -> bool:
        return self._closing

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel what is queued or running and stop; waits (``timeout_s``) until the lane
        has shut the scheduler down, or does it at once when called on the lane itself."""
        with self._lock:
            self._closing = True
        lane.wake()
        if self.failure is not None:  # the lane may be parked inside llama.cpp: never wait
            return
        if lane.on_lane():
            self._stop()
        self._stopped.wait(timeout_s)
        if self._stopped.is_set():
            self._batch.close()  # idempotent

    @property
    def running(self) -> bool:
        """Not yet shut down (a close that timed out leaves it running: leak, don't free)."""
        return not self._stopped.is_set()

    def fail(self, reason: str) -> None:
        """The context can never compute again (a lost RPC worker): end every request with
        ``reason`` and refuse new ones. Called from another thread while the lane thread
        is stuck inside ``llama_decode``, so it touches no llama.cpp object (slots, sampler
        chains): those leak with the context."""
        with self._lock:
            self.failure = reason
            self._closing = True
            jobs = [*self._decoding, *self._prefilling, *self._waiting, *self._incoming]
            self._incoming.clear()
            calls = list(self._calls)
        lane.wake()
        for job in jobs:
            self._abandon(job, reason)
        for _, future in calls:
            future.cancel()

    def _abandon(self, job: Job, reason: str) -> None:
        if job.handle.finished:
            return
        job.clock.finished = time.perf_counter()
        self._meter.record_finish("error")
        job.handle.finished = True
        job.handle.push_finish(FinishEvent("error", job.clock.stats(), reason, fatal=True))

    # --- the loop (on the compute lane) -------------------------------------------------------

    def run_once(self) -> float | None:
        """One step if there is work (0.0: call again); else the seconds until the metrics
        are due; None once shut down or failed (the lane forgets this scheduler). Runs every
        step: the checks are inline."""
        if self.failure is not None or self._shut_down:
            return None  # failed: fail() ended every request; llama.cpp is never touched again
        if self._incoming or self._closing:  # read unlocked: the writers wake the lane after
            with self._lock:
                self._waiting.extend(self._incoming)
                self._incoming.clear()
                closing = self._closing
            if closing:
                self._stop()
                return None
        meter = self._meter
        if self._waiting or self._prefilling or self._decoding or self._calls:
            self.wakes.gathering_thread = threading.get_ident()
            try:
                self._step()
            except Exception as exc:  # a bug must cost the requests in flight, not the engine
                log.exception("engine step failed")
                for job in [*self._decoding, *self._prefilling]:
                    self._fail(job, f"internal engine error: {exc}")
            finally:
                self.wakes.flush()
            now = time.perf_counter()
            if self.failure is None and now >= meter.earliest_due:
                meter.publish_due(now)
            return 0.0
        now = time.perf_counter()
        meter.publish_due(now)
        due_s = meter.seconds_until_due(now)
        return math.inf if due_s is None else due_s

    def _stop(self) -> None:
        if not self._shut_down:
            self._shutdown()
            self._shut_down = True
            self._stopped.set()

    def _shutdown(self) -> None:
        with self._lock:
            self._waiting.extend(self._incoming)
            self._incoming.clear()
        for job in [*self._decoding, *self._prefilling, *self._waiting]:
            self._finish(job, "cancelled", error=None)
        self._waiting.clear()
        for _, future in self._calls:
            future.cancel()

    def _step(self) -> None:
        if self._profile is not None:
            self._profiled_step(self._profile)
            return
        if self._calls:
            self._run_calls()
        if self._cancel_noted:
            self._drop_cancelled()
        if self._waiting:
            self._admit()
        if self._speculator is not None:
            self._propose()
        elif not self._prefilling:
            if self._decoding:
                self._generate()
            return
        parts = self._plan_batch()
        if parts:
            self._decode(parts)
        if self._image_steps:
            self._decode_images()

    def _profiled_step(self, profile: StepProfile) -> None:
        """``_step``, timed phase by phase (see :class:`~homelab.engine.metrics.StepProfile`)."""
        clock = time.perf_counter
        started = clock()
        self._run_calls()
        self._drop_cancelled()
        self._admit()
        admitted = clock()
        self._propose()
        drafted = clock()
        parts = self._plan_batch()
        batch = self._fill(parts) if parts else None
        built = clock()
        status = self._context.decode(batch) if batch is not None else 0
        decoded = clock()
        inner = ("sample", *PER_TOKEN_PHASES)
        before = sum(profile.total(phase) for phase in inner)
        if parts:
            self._after_status(parts, status)
        if self._image_steps:
            self._decode_images()
        ended = clock()
        sampled = sum(profile.total(phase) for phase in inner) - before
        for phase, seconds in (
            ("admit", admitted - started),
            ("draft", drafted - admitted),
            ("batch", built - drafted),
            ("decode", decoded - built),
            ("emit", ended - decoded - sampled),
        ):
            profile.add(phase, seconds)
        profile.step_done()

    # --- admission and cancellation ------------------------------------------------------

    def _drop_cancelled(self) -> None:
        if not self._cancel_noted:  # a handle sets `cancelled` before it notes it
            return
        self._cancel_noted = False
        for job in [*self._decoding, *self._prefilling]:
            if job.handle.cancelled:
                self._finish(job, "cancelled")
        if any(job.handle.cancelled for job in self._waiting):
            for job in [job for job in self._waiting if job.handle.cancelled]:
                self._waiting.remove(job)
                self._dequeued()
                self._finish(job, "cancelled")

    def _dequeued(self) -> None:
        with self._lock:
            self._n_queued -= 1

    def _admit(self) -> None:
        while self._waiting and self._slots.n_free:
            job = self._waiting.popleft()
            self._dequeued()
            try:
                self._admit_one(job)
            except Exception as exc:  # that job fails and its slot frees; the others go on
                log.exception("admitting a request failed")
                self._fail(job, f"internal engine error while admitting the request: {exc}")

    def _admit_one(self, job: Job) -> None:
        """Give ``job`` a slot (its cached prefix reused) and start reading its prompt."""
        placement = self._slots.acquire(job.request.tenant, job.prompt)
        assert placement is not None  # n_free > 0
        job.slot = placement.slot
        job.n_past = job.prompt_pos = placement.n_cached
        job.clock.cached_tokens = placement.n_cached
        job.clock.started = time.perf_counter()
        if job.images is not None:
            self._admit_images(job, job.images.prompt)
            return
        job.chain.accept_prompt(job.prompt)
        if self._speculator is not None:
            job.spec = self._speculator.start(
                job.slot.seq_id,
                job.prompt,
                placement.n_cached,
                job.request.sampling,
                job.request.tenant,
            )
        self._prefilling.append(job)

    # --- drafts ----------------------------------------------------------------------------

    def _propose(self) -> None:
        """Let the speculator draft for the generating sequences (never fatal to them)."""
        if self._speculator is None or not self._decoding:
            return
        # in slot order; a prompt with images does not speculate
        requests = [self._draft_request(job) for job in self._decoding if job.spec is not None]
        reserve = self.config.prefill_chunk_tokens if self._prefilling else 0
        room = self.config.n_batch - len(self._decoding) - reserve
        try:
            self._speculator.propose(requests, room)
        except Exception:
            log.exception("drafting failed; decoding without drafts this step")
            for request in requests:
                request.state.proposal = None

    def _draft_request(self, job: Job) -> DraftRequest:
        assert job.slot is not None and job.spec is not None
        remaining = job.max_tokens - job.clock.completion_tokens  # tokens it may still emit
        room = self.config.n_ctx_per_slot - job.n_past  # cells left for [last, *draft]
        limit = min(remaining, room) - 1
        return DraftRequest(
            job.slot.seq_id, job.slot.tokens, job.last_token, limit, job.request.sampling, job.spec
        )

    # --- building and running the batch ---------------------------------------------------

    def _plan_batch(self) -> list[_Part]:
        """This step's parts, in slot order: with one cache stream per slot, llama.cpp splits
        a batch wherever the next sequence id is not the last one plus one, and computes
        each piece as a graph of its own (8 slots one swap out of order: 1.6x the time)."""
        parts = [self._decode_part(job) for job in self._decoding]
        if not self._prefilling:
            return parts  # the generating list is kept in slot order
        room = self.config.n_batch - sum(len(part.tokens) for part in parts)
        budget = min(room, self.config.prefill_chunk_tokens) if parts else room
        for job in self._prefilling:
            if budget <= 0:
                break
            ahead = len(job.prompt) - job.prompt_pos
            if job.images is not None:
                ahead = job.images.prompt.text_ahead(job.prompt_pos)
                if ahead == 0:  # the next piece of its prompt is an image
                    budget -= self._plan_image(job, budget)
                    continue
            take = min(ahead, budget)
            tokens = job.prompt[job.prompt_pos : job.prompt_pos + take]
            completes = job.prompt_pos + take == len(job.prompt)
            parts.append(_Part(job, job.n_past, tokens, completes, True))
            budget -= take
        return sorted(parts, key=lambda part: _seq_id(part.job))  # prefill parts among the rest

    def _generate(self) -> None:
        """The step nearly every token takes: each sequence generates (no prompt is being
        read, nothing drafted), so each brings its one last token and samples one. The same
        as building parts and handing them to ``_after_decode``, in fewer Python calls: at
        GPU step times (~0.3 ms on the tiny demo model here) they are what a token costs.

        While nothing else happens (see ``_step_again``) the same sequences step again at
        once, without going back to the lane: the batch keeps its rows, only their tokens and
        positions change."""
        jobs = tuple(self._decoding)
        batch = self._batch
        batch.clear()
        for job in jobs:
            job.batch_index = batch.add_one(job.last_token, job.n_past, job.slot.seq_id)  # type: ignore[union-attr]
        if all(job.chain.plain_greedy for job in jobs):
            self._generate_greedy(jobs, batch)
            return
        decode, n_jobs = self._context.decoder(batch), len(jobs)
        while True:
            status = decode()
            if status != 0:
                self._after_status([self._decode_part(job) for job in jobs], status)
                return
            for job in jobs:
                job.slot.tokens.append(job.last_token)  # type: ignore[union-attr]
                job.n_past += 1
            self._sample_each(jobs)
            if not self._step_again(jobs, n_jobs, batch):
                return

    def _generate_greedy(self, jobs: tuple[Job, ...], batch: Batch) -> None:
        """``_generate`` when every sequence samples plain greedy: one argmax over the step's
        logits picks every token (see ``_sample_greedy_batch``), and a pick that is plain text
        (the first branch of ``_emit``) is handed over right here. Everything a step reads is
        bound before the first one: each Python call a step makes costs ~10x its cost in a
        loop (the decode in between leaves the caches cold; 16 calls a token at one stream,
        counted by tests/engine/test_step_overhead.py)."""
        decode = self._context.decoder(batch)
        logits_of, n_jobs = self._context.output_logits, len(jobs)
        eog, whole_texts = self._eog, self._whole_texts
        while True:
            status = decode()
            if status != 0:
                self._after_status([self._decode_part(job) for job in jobs], status)
                return
            logits = logits_of(n_jobs)
            picks = logits.argmax(axis=1).tolist() if logits is not None else [-1] * n_jobs
            for index, job in enumerate(jobs):
                job.slot.tokens.append(job.last_token)  # type: ignore[union-attr]
                job.n_past += 1
                token, clock = picks[index], job.clock
                n_tokens = clock.completion_tokens + 1
                text = whole_texts.get(token)
                if (
                    text is not None
                    and job.utf8.idle
                    and job.plain_text
                    and n_tokens < job.max_tokens
                    and token not in eog
                ):
                    clock.completion_tokens = n_tokens
                    job.handle.push(new_token_event((text, token, None)))
                    job.last_token = token
                else:
                    self._emit_pick(job, token, logits, index)
            if not self._step_again(jobs, n_jobs, batch):
                return

    def _emit_pick(self, job: Job, token: int, logits: np.ndarray | None, index: int) -> None:
        """A greedy pick that is not plain text: an end of generation (banned or not), a
        token whose bytes are not whole, stop strings, log-probabilities, the last token;
        sampled by its own chain if the decode kept no logits (never expected)."""
        try:
            if logits is None:
                token = job.chain.sample(self._context, job.batch_index)
            elif token in self._eog and self._eog_banned(job):
                token = self._pick_without_eog(logits[index])
            self._emit(job, token, job.batch_index)
        except Exception as exc:
            log.exception("sampling failed for request %s", job.handle.request_id)
            self._fail(job, f"sampling failed: {exc}")

    def _step_again(self, jobs: tuple[Job, ...], n_jobs: int, batch: Batch) -> bool:
        """After a generating step of ``jobs`` (``n_jobs`` of them): record it, wake its
        readers (no sooner than ``STREAM_WAKE_INTERVAL_S`` after the last wake), and say
        whether the same sequences step again at once — none has finished (no slot freed for
        a waiting request), nothing came in (a request, a cancellation, a call, closing), no
        metrics are due and the lane has no other resident or work (``lane.alone``). If so
        their rows get their next token and position. Gathering wakes goes on until the
        lane's step ends (``run_once`` flushes)."""
        now = time.perf_counter()
        self._meter.record_generating_step(now, n_jobs)
        wakes = self.wakes
        if wakes.gathered and now - wakes.last_steady_wake >= STREAM_WAKE_INTERVAL_S:
            wakes.wake_gathered()
            wakes.last_steady_wake = now
        if (
            len(self._decoding) != n_jobs
            or self._incoming
            or self._cancel_noted
            or self._calls
            or self._closing
            or self.failure is not None
            or now >= self._meter.earliest_due
            or not lane.alone(self, now)
        ):
            return False
        for job in jobs:
            batch.advance(job.batch_index, job.last_token, job.n_past)
        return True

    @staticmethod
    def _decode_part(job: Job) -> _Part:
        proposal = job.spec.proposal if job.spec is not None else None
        draft = proposal.tokens if proposal is not None else ()
        return _Part(job, job.n_past, [job.last_token, *draft], True, False, draft)

    def _fill(self, parts: list[_Part]) -> Batch:
        batch = self._batch
        batch.clear()
        for part in parts:
            seq = part.job.slot.seq_id  # type: ignore[union-attr]
            every = bool(part.draft)  # a draft is verified at each of its positions
            row = batch.add_run(
                part.tokens, part.start_pos, seq, output_last=part.sample, output_all=every
            )
            part.first_row = row - len(part.tokens) + 1
            if part.sample:
                part.job.batch_index = row
        return batch

    def _decode(self, parts: list[_Part]) -> None:
        self._after_status(parts, self._context.decode(self._fill(parts)))

    def _after_status(self, parts: list[_Part], status: int) -> None:
        if self.failure is not None:
            return
        if status != 0:
            self._recover(parts, status)
            return
        self._after_decode(parts)
        if self._speculator is not None and not any(part.prefill for part in parts):
            self._speculator.end_step()  # a decode-only step: the speculator measures it

    def _after_decode(self, parts: list[_Part]) -> None:
        prefill_tokens = decode_tokens = drafted = accepted = prefilling = 0
        sampling: list[_Part] = []
        for part in parts:
            if part.sample:
                sampling.append(part)
            if part.draft:
                continue  # how much of it stays in the cache is known after verifying
            job, n_tokens = part.job, len(part.tokens)
            job.slot.tokens.extend(part.tokens)  # type: ignore[union-attr]
            job.n_past += n_tokens
            if part.prefill:
                job.prompt_pos += n_tokens
                job.clock.evaluated_tokens += n_tokens
                prefill_tokens += n_tokens
                prefilling += 1
            elif part.sample:
                decode_tokens += 1  # a generating sequence's one token
        if any(part.draft for part in sampling) or not self._sample_greedy_batch(
            [part.job for part in sampling]
        ):
            self._sample_each([part.job for part in sampling if not part.draft])
            for part in sampling:
                if part.draft:
                    emitted, kept = self._verify_safely(part)
                    decode_tokens += emitted
                    drafted += len(part.draft)
                    accepted += kept
        n_sequences = len(parts) - prefilling
        self._meter.record_step(
            time.perf_counter(), prefill_tokens, decode_tokens, n_sequences, drafted, accepted
        )

    def _recover(self, parts: list[_Part], status: int) -> None:
        """Roll the failed step back, then retry each sequence alone to find the culprit."""
        log.warning("llama_decode failed (status %d) for %d sequences", status, len(parts))
        for part in parts:
            if not self._slots.rollback(part.job.slot, part.job.n_past):  # type: ignore[arg-type]
                self._fail(part.job, f"llama.cpp failed to decode (status {status})")
        survivors = [part for part in parts if part.job.slot is not None]
        if len(parts) == 1:
            if survivors:
                self._fail(parts[0].job, f"llama.cpp failed to decode (status {status})")
            return
        for part in survivors:
            alone = self._context.decode(self._fill([part]))
            if alone != 0:
                self._slots.rollback(part.job.slot, part.job.n_past)  # type: ignore[arg-type]
                self._fail(part.job, f"llama.cpp failed to decode (status {alone})")
            else:
                self._after_decode([part])

    # --- images (see image_prefill) -------------------------------------------------------

    def _admit_images(self, job: Job, prompt: ImagePrompt) -> None:
        """Placed: a cached prefix holds whole images only; counts are KV cells (as mtmd
        counts tokens); no speculation (a draft cannot read the images)."""
        assert job.slot is not None
        n_whole = prompt.whole_images_only(job.n_past)
        if n_whole < job.n_past and not self._slots.rollback(job.slot, n_whole):
            n_whole = 0
        job.n_past = job.prompt_pos = n_whole
        job.clock.cached_tokens = prompt.cells_before(n_whole)
        job.chain.accept_prompt(prompt.text_tokens)
        self._prefilling.append(job)

    def _plan_image(self, job: Job, budget: int) -> int:
        """Plan this step's rows of the image at the job's next position; the budget used."""
        assert self._images is not None and job.images is not None
        span = job.images.prompt.image_at(job.prompt_pos)
        assert span is not None
        rows = self._images.rows_for(job.images, span, budget)
        self._image_steps.append((job, span, rows))
        return rows

    def _decode_images(self) -> None:
        """Decode the planned image rows (after the token batch: one decode each)."""
        steps, self._image_steps = self._image_steps, []
        assert self._images is not None
        for job, span, rows in steps:
            if job.slot is None or job.images is None:
                continue  # finished meanwhile (failed in the token batch)
            try:
                whole = self._images.step(job.images, span, job.slot.seq_id, rows)
            except Exception as exc:
                log.exception("an image failed for request %s", job.handle.request_id)
                self._fail(job, str(exc))  # clears the slot: its cache may be half-written
                continue
            self._meter.record_step(time.perf_counter(), rows, 0)
            if whole:
                job.slot.tokens.extend(job.images.prompt.tokens[span.start : span.end])
                job.n_past += span.n_pos
                job.prompt_pos += span.n_pos
                job.clock.evaluated_tokens += span.n_tokens

    # --- sampling and text ------------------------------------------------------------------

    def _sample_greedy_batch(self, jobs: Sequence[Job]) -> bool:
        """Pick the most likely token of every sequence with one argmax over the step's
        logits, when each of them samples greedily and nothing else (no grammar, penalties,
        biases or log-probabilities; the caller sees there are no drafts): one numpy call
        instead of a sampler call per sequence, each copying the whole vocabulary (~2 µs
        against ~5 µs for one sequence over 1,024 tokens, ~30 against ~80 over 32,000).
        False: sample them one by one."""
        for job in jobs:  # a loop, not all(): no generator to run every step
            if not job.chain.plain_greedy:
                return False
        # each job's last token, in order
        logits = self._context.output_logits(len(jobs)) if jobs else None
        if logits is None:
            return False
        started = time.perf_counter() if self._profile is not None else 0.0
        picks = logits.argmax(axis=1).tolist()  # the greedy sampler's pick: the first maximum
        if self._profile is not None:
            self._profile.add("sample", time.perf_counter() - started)
        for index, job in enumerate(jobs):
            self._emit_pick(job, picks[index], logits, index)
        return True

    def _pick_without_eog(self, row: np.ndarray) -> int:
        """The most likely token of ``row`` once end-of-generation is banned (only asked when
        the plain pick was an end: banning first would cost every step ~10 µs)."""
        row[self._eog_ids] = -np.inf  # nobody reads these logits again
        return int(row.argmax())

    def _eog_banned(self, job: Job) -> bool:
        return job.ignore_eos or self._before_min_tokens(job)

    def _sample_each(self, jobs: Sequence[Job]) -> None:
        """Sample each job from its own logits row with its own sampler chain, and emit."""
        context, profile = self._context, self._profile
        for job in jobs:
            row = job.batch_index
            try:
                if job.clock.completion_tokens < job.min_tokens:  # _before_min_tokens, inline
                    self._ban_eog(row)
                if profile is None:
                    token = job.chain.sample(context, row)
                else:
                    started = time.perf_counter()
                    token = job.chain.sample(context, row)
                    profile.add("sample", time.perf_counter() - started)
                self._emit(job, token, row)
            except Exception as exc:
                log.exception("sampling failed for request %s", job.handle.request_id)
                self._fail(job, f"sampling failed: {exc}")

    @staticmethod
    def _before_min_tokens(job: Job) -> bool:
        """Whether end-of-generation is still banned (``min_tokens`` not reached)."""
        return job.clock.completion_tokens < job.min_tokens

    def _ban_eog(self, row: int) -> None:
        """End-of-generation tokens cannot be sampled from ``row`` of the last decode."""
        self._context.logits_row(row)[self._eog_ids] = -np.inf

    def _verify_safely(self, part: _Part) -> tuple[int, int]:
        """Verify a draft and emit what it keeps: (tokens emitted, drafted tokens kept)."""
        try:
            return self._verify(part)
        except Exception as exc:
            log.exception("verifying a draft failed for request %s", part.job.handle.request_id)
            if part.job.slot is not None:
                self._fail(part.job, f"sampling failed: {exc}")
            return 0, 0

    def _verify(self, part: _Part) -> tuple[int, int]:
        job = part.job
        spec, slot = job.spec, job.slot
        assert spec is not None and spec.proposal is not None and slot is not None
        proposal, spec.proposal = spec.proposal, None
        ignore_eos = job.request.sampling.ignore_eos
        rows = range(part.first_row, part.first_row + len(part.tokens))
        if self._before_min_tokens(job):  # the whole run: a draft rarely crosses min_tokens
            for row in rows:
                self._ban_eog(row)
        verdict = verify(
            job.chain,
            self._context,
            rows,
            proposal,
            lambda token: token in self._eog and not ignore_eos,
            spec.rng,
        )
        keep = len(verdict.tokens)  # the cache holds [last, *draft]: keep [last, *kept]
        slot.tokens.extend(part.tokens[:keep])
        job.n_past += keep
        if keep < len(part.tokens) and not self._slots.rollback(slot, job.n_past):
            self._fail(job, "llama.cpp could not drop the rejected draft tokens")
            return 0, verdict.accepted
        self._speculator.settle(spec, len(part.draft), verdict.accepted)  # type: ignore[union-attr]
        job.clock.draft_tokens += len(part.draft)
        return self._emit_kept(job, verdict.tokens, verdict.accepted, part.first_row), (
            verdict.accepted
        )

    def _emit_kept(self, job: Job, tokens: tuple[int, ...], accepted: int, first_row: int) -> int:
        """Emit a verified run one token at a time, as plain decoding would; stop where the
        request ends (stop string, max_tokens, end of generation, or a cancellation)."""
        for index, token in enumerate(tokens):
            if index > 0 and job.handle.cancelled:
                self._finish(job, "cancelled")
                return index
            if index < accepted:
                job.clock.accepted_draft_tokens += 1
            if not self._emit(job, token, first_row + index):
                return index + 1
        return len(tokens)

    def _emit(self, job: Job, token: int, row: int) -> bool:
        """Hand one sampled token to the request; False when the request has ended.

        Most tokens are text and nothing else: whole UTF-8 by themselves (``piece`` has
        seen them), no bytes pending, no stop strings or log-probabilities, not the end.
        They take the first branch — the rest of this method in one place, since every
        step pays for each Python call it makes (~10x its cost in a loop: the decode in
        between leaves the CPU's caches cold; ``_generate_greedy`` repeats this branch in
        its own loop for that reason: change both). Not while the steps are profiled (the
        phases are timed in the long way)."""
        clock = job.clock
        n_tokens = clock.completion_tokens + 1
        whole = self._whole_texts.get(token)
        if (
            whole is not None
            and job.utf8.idle
            and job.plain_text
            and n_tokens < job.max_tokens
            and token not in self._eog
            and clock.first_token
            and self._profile is None
        ):
            clock.completion_tokens = n_tokens
            job.handle.push(new_token_event((whole, token, None)))
            job.last_token = token
            return True
        if not clock.first_token:
            self._first_token(job)
        clock.completion_tokens += 1
        logprob = self._logprob(job, token, row) if job.wants_logprobs else None
        if token in self._eog and not job.ignore_eos:
            text = self._release_held(job, "")
            if text:
                self._hand_over(job, TokenEvent(text, token, logprob))
            self._finish(job, "stop")
            return False
        text = self._detokenize(job, token)
        if job.stop is not None:
            text, stopped = self._match_stops(job.stop, text)
            if stopped:
                self._hand_over(job, TokenEvent(text, token, logprob))
                self._finish(job, "stop")
                return False
        if clock.completion_tokens >= job.max_tokens:
            self._hand_over(job, TokenEvent(self._release_held(job, text), token, logprob))
            self._finish(job, "length")
            return False
        self._hand_over(job, TokenEvent(text, token, logprob))
        job.last_token = token
        return True

    def _first_token(self, job: Job) -> None:
        """The request's prompt is read: it generates from now on."""
        job.clock.first_token = time.perf_counter()
        self._meter.record_first_token(job.clock.first_token - job.clock.submitted)
        self._prefilling.remove(job)
        bisect.insort(self._decoding, job, key=_seq_id)

    # the per-token parts of _emit, each its own phase when the engine profiles its steps

    def _detokenize(self, job: Job, token: int) -> str:
        data = self._pieces.get(token)
        if data is None:
            data = self.piece(token)
        return job.utf8.feed(data, self._whole_texts.get(token))

    @staticmethod
    def _match_stops(stop: StopMatcher, text: str) -> tuple[str, bool]:
        return stop.feed(text)

    @staticmethod
    def _hand_over(job: Job, event: TokenEvent) -> None:
        job.handle.push(event)

    def _release_held(self, job: Job, text: str) -> str:
        """The end of the stream: whatever the decoder and the stop matcher still hold."""
        tail = job.utf8.flush()
        if job.stop is None:
            return text + tail
        more, stopped = job.stop.feed(tail)
        return text + more + ("" if stopped else job.stop.flush())

    def piece(self, token: int) -> bytes:
        """A token's bytes as output text (control tokens are empty), cached; with its
        text in ``_whole_texts`` when the bytes are complete UTF-8 by themselves."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._vocab.token_bytes(token, special=False)
            self._pieces[token] = cached
            with contextlib.suppress(UnicodeDecodeError):  # else part of a character
                self._whole_texts[token] = cached.decode("utf-8")
        return cached

    def _logprob(self, job: Job, token: int, row: int) -> TokenLogprob:
        n_top = job.request.sampling.logprobs or 0
        logits = self._context.logits_row(row)
        chosen, top = top_logprobs(logits, token, n_top)
        text = self._display(token)
        return TokenLogprob(text, chosen, tuple((self._display(t), lp) for t, lp in top))

    def _display(self, token: int) -> str:
        return self.piece(token).decode("utf-8", errors="replace")

    # --- finishing ----------------------------------------------------------------------------

    def _fail(self, job: Job, message: str) -> None:
        if job.slot is not None:
            self._slots.clear(job.slot)  # its cache may be half-written
        self._finish(job, "error", error=message)

    def _finish(self, job: Job, reason: FinishReason, error: str | None = None) -> None:
        clock = job.clock
        clock.finished = time.perf_counter()
        job.chain.close()
        if job.slot is not None:
            if job.images is not None and job.images.rows_done:  # cut inside an image
                self._slots.rollback(job.slot, job.n_past)  # the cache holds whole ones only
            self._slots.release(job.slot)
            job.slot = None
        if job in self._decoding:
            self._decoding.remove(job)
        elif job in self._prefilling:
            self._prefilling.remove(job)
        self._meter.record_finish(reason)
        job.handle.finished = True
        job.handle.push_finish(FinishEvent(reason, clock.stats(), error))


def _seq_id(job: Job) -> int:
    """The sequence id of a job's slot (the generating list and every batch go in this order;
    see ``_plan_batch``)."""
    assert job.slot is not None
    return job.slot.seq_id
