"""Continuous batching: one ``llama_decode`` per step, every sequence in it, on the lane.

Each step the scheduler

1. drops cancelled requests (their slot is free for this very step),
2. places waiting requests in free slots (tenant-isolated prefix cache, see ``slots``): a
   queued :class:`~homelab.engine.job.Job` becomes an ``AdmittedJob`` holding its slot,
3. builds one ``llama_batch``: one token for every generating sequence (with its draft, when
   the engine speculates: ``drafting``), then prefill chunks of prompts still being read — at
   most ``prefill_chunk_tokens`` per step while others are generating, so a long prompt never
   stalls everyone else's tokens for long; an image in a prompt takes that budget in a decode
   of its own after the batch (``image_prefill``),
4. calls ``llama_decode`` once, and
5. samples every sequence that needs a token and emits it (``emit``: one argmax for a step
   of plain greedy sequences, else each with its own C sampler chain; complete UTF-8 only,
   stop strings held back), verifying drafts first, and hands the events to the request
   handles (``handle``).

The step nearly every token takes — every sequence generating, nothing read or drafted — is
the same step in fewer Python calls (:meth:`Scheduler._generate`): its batch keeps its rows,
and while nothing else happens the same sequences step again without going back to the lane.
Each call a step makes costs ~10x its cost in a loop (the decode in between leaves the CPU's
caches cold): ~16 Python calls a token at one greedy stream, ~8 at eight, counted by
tests/engine/test_step_overhead.py. Every batch goes in slot order: with one cache stream per
slot, llama.cpp splits a batch wherever the next sequence id is not the last one plus one
(8 slots, one swap out of order: 1.6x the step's time).

Requests join at the next step and leave the moment they finish. If ``llama_decode`` fails,
the step is rolled back and each sequence retried on its own, so only the request that
really fails gets an error; any Python error while handling one request fails that request,
never the engine.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from homelab.engine.api import FinishEvent, FinishReason
from homelab.engine.drafting import Drafting
from homelab.engine.emit import Emitter
from homelab.engine.handle import LoopWakes
from homelab.engine.image_prefill import ImagePrefill, ImageSteps
from homelab.engine.job import AdmittedJob, Job, Part, SchedulerConfig, seq_id
from homelab.engine.metrics import PER_TOKEN_PHASES, EngineMeter, StepProfile
from homelab.engine.slots import SlotTable
from homelab.engine.speculation.speculator import Speculator
from homelab.llamacpp import lane
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context
from homelab.llamacpp.vocab import Vocab

# while the same sequences step again and again, their asyncio readers are woken at most this
# often, and take what has come meanwhile at once: a wake costs the event loop ~30 µs, which on
# two cores the decoding threads wait for — at the tiny models' 0.3 ms steps, every token. At a
# GPU's step times (1 ms and more) every token still wakes its reader when it comes; what a
# reader does not yet know waits at most this long and one step (vLLM's --stream-interval
# makes the same trade in tokens)
STREAM_WAKE_INTERVAL_S = 0.001

log = logging.getLogger("homelab.engine")

T = TypeVar("T")


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
        self._slots = slots
        self._meter = meter
        self.config = config
        self._lock = threading.Lock()  # guards _incoming, _calls, _closing, _n_queued
        self._incoming: deque[Job] = deque()
        self._waiting: deque[Job] = deque()
        self._prefilling: list[AdmittedJob] = []
        self._decoding: list[AdmittedJob] = []  # in slot order (see _plan_batch)
        self._n_queued = 0  # incoming + waiting, for the queue bound (guarded by _lock)
        self._cancel_noted = False  # a handle was cancelled since the last look
        self.wakes = LoopWakes()  # the asyncio readers to wake when a step ends
        self._closing = False
        self.failure: str | None = None  # set by fail(): this context can never compute again
        self._calls: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self._batch = Batch(config.n_batch)
        self._stopped = threading.Event()  # set on the lane once the scheduler has shut down
        self._shut_down = False  # the same, read by every step (a plain attribute is cheaper)
        self._emitter = Emitter(
            context, vocab, eog_tokens, profile, self._started, self._finish, self._fail
        )
        self._images = ImageSteps(images, slots, meter, self._fail)
        self._drafting = (
            Drafting(speculator, context, slots, config, self._emitter, self._finish, self._fail)
            if speculator is not None
            else None
        )

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

    def end_all(self, reason: str) -> int:
        """End every request in flight, queued or admitted, with ``reason`` (a fatal error
        its client sees); their slots free and the scheduler goes on. On the lane (call it
        through :meth:`call_between_steps`); how many were ended."""
        with self._lock:
            queued = [*self._waiting, *self._incoming]
            self._waiting.clear()
            self._incoming.clear()
        admitted = [*self._decoding, *self._prefilling]
        for job in admitted:
            self._finish(job, "error", error=reason, fatal=True)
        for waiting in queued:
            self._abandon(waiting, reason)
        return len(admitted) + len(queued)

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
        """One step: calls, cancellations, admissions, drafts, then the batch decoded and its
        tokens emitted — or, when every sequence generates and none drafts, the steady step
        (``_generate``)."""
        if self._profile is not None:
            self._profiled_step(self._profile)
            return
        if self._calls:
            self._run_calls()
        if self._cancel_noted:
            self._drop_cancelled()
        if self._waiting:
            self._admit()
        if self._drafting is not None:
            self._drafting.propose(self._decoding, self._prefilling)
        elif not self._prefilling:
            if self._decoding:
                self._generate()
            return
        parts = self._plan_batch()
        if parts:
            self._decode(parts)
        if self._images.planned:
            self._images.decode_planned()

    def _profiled_step(self, profile: StepProfile) -> None:
        """``_step``, timed phase by phase (see :class:`~homelab.engine.metrics.StepProfile`)."""
        clock = time.perf_counter
        started = clock()
        self._run_calls()
        self._drop_cancelled()
        self._admit()
        admitted = clock()
        if self._drafting is not None:
            self._drafting.propose(self._decoding, self._prefilling)
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
        if self._images.planned:
            self._images.decode_planned()
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
            for queued in [job for job in self._waiting if job.handle.cancelled]:
                self._waiting.remove(queued)
                self._dequeued()
                self._finish(queued, "cancelled")

    def _dequeued(self) -> None:
        with self._lock:
            self._n_queued -= 1

    def _admit(self) -> None:
        while self._waiting and self._slots.n_free:
            queued = self._waiting.popleft()
            self._dequeued()
            try:
                self._admit_one(queued)
            except Exception as exc:  # that job fails and its slot frees; the others go on
                log.exception("admitting a request failed")
                message = f"internal engine error while admitting the request: {exc}"
                self._finish(queued, "error", error=message)

    def _admit_one(self, queued: Job) -> None:
        """Give ``queued`` a slot (its cached prefix reused) and start reading its prompt.
        ``slots.acquire`` frees the slot itself when a restore fails; a failure after it
        fails the admitted job, which clears and frees its slot."""
        placement = self._slots.acquire(queued.request.tenant, queued.prompt)
        assert placement is not None  # n_free > 0
        job = AdmittedJob.place(queued, placement.slot, placement.n_cached)
        try:
            self._start(job, placement.n_cached)
        except Exception as exc:
            log.exception("starting an admitted request failed")
            self._fail(job, f"internal engine error while admitting the request: {exc}")

    def _start(self, job: AdmittedJob, n_cached: int) -> None:
        job.clock.cached_tokens = n_cached
        job.clock.started = time.perf_counter()
        if job.images is not None:
            self._images.admit(job, job.images.prompt)
        else:
            job.chain.accept_prompt(job.prompt)
            if self._drafting is not None:
                self._drafting.start(job, n_cached)
        self._prefilling.append(job)

    # --- building and running the batch ---------------------------------------------------

    def _plan_batch(self) -> list[Part]:
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
                    budget -= self._images.plan(job, job.images, budget)
                    continue
            take = min(ahead, budget)
            tokens = job.prompt[job.prompt_pos : job.prompt_pos + take]
            completes = job.prompt_pos + take == len(job.prompt)
            parts.append(Part(job, job.n_past, tokens, completes, True))
            budget -= take
        return sorted(parts, key=lambda part: seq_id(part.job))  # prefill parts among the rest

    def _generate(self) -> None:
        """The steady step, the one nearly every token takes: each sequence generates (no
        prompt is being read, nothing drafted), so each brings its one last token and samples
        one — the step of ``_plan_batch`` and ``_after_decode`` in fewer Python calls: at GPU
        step times (~0.3 ms on the tiny demo model here) they are what a token costs. Its
        sampling is one of the emitter's two variants, chosen once: one argmax for all when
        every sequence samples plain greedy, else each with its own chain.

        After each step it is recorded and its readers woken (no sooner than
        ``STREAM_WAKE_INTERVAL_S`` after the last wake; gathering goes on until the lane's
        step ends: ``run_once`` flushes). The same sequences then step again at once, without
        going back to the lane — the batch keeps its rows, only their tokens and positions
        change — while none has finished (no slot freed for a waiting request), nothing came
        in (a request, a cancellation, a call, closing), no metrics are due and the lane has
        no other resident or work (``lane.alone``). Everything a step reads is bound before
        the first one."""
        jobs = tuple(self._decoding)
        batch = self._batch
        batch.clear()
        for job in jobs:
            job.batch_index = batch.add_one(job.last_token, job.n_past, job.slot.seq_id)
        greedy = all(job.chain.plain_greedy for job in jobs)
        emitter, meter, wakes = self._emitter, self._meter, self.wakes
        decode, n_jobs = self._context.decoder(batch), len(jobs)
        while True:
            status = decode()
            if status != 0:
                self._after_status([self._decode_part(job) for job in jobs], status)
                return
            for job in jobs:
                job.slot.tokens.append(job.last_token)
                job.n_past += 1
            if greedy:
                emitter.sample_greedy(jobs, n_jobs)
            else:
                emitter.sample_each(jobs)
            now = time.perf_counter()
            meter.record_generating_step(now, n_jobs)
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
                or now >= meter.earliest_due
                or not lane.alone(self, now)
            ):
                return
            for job in jobs:
                batch.advance(job.batch_index, job.last_token, job.n_past)

    @staticmethod
    def _decode_part(job: AdmittedJob) -> Part:
        proposal = job.spec.proposal if job.spec is not None else None
        draft = proposal.tokens if proposal is not None else ()
        return Part(job, job.n_past, [job.last_token, *draft], True, False, draft)

    def _fill(self, parts: list[Part]) -> Batch:
        batch = self._batch
        batch.clear()
        for part in parts:
            every = bool(part.draft)  # a draft is verified at each of its positions
            row = batch.add_run(
                part.tokens,
                part.start_pos,
                part.job.slot.seq_id,
                output_last=part.sample,
                output_all=every,
            )
            part.first_row = row - len(part.tokens) + 1
            if part.sample:
                part.job.batch_index = row
        return batch

    def _decode(self, parts: list[Part]) -> None:
        self._after_status(parts, self._context.decode(self._fill(parts)))

    def _after_status(self, parts: list[Part], status: int) -> None:
        if self.failure is not None:
            return
        if status != 0:
            self._recover(parts, status)
            return
        self._after_decode(parts)
        if self._drafting is not None and not any(part.prefill for part in parts):
            self._drafting.end_step()  # a decode-only step: the speculator measures it

    def _after_decode(self, parts: list[Part]) -> None:
        prefill_tokens = decode_tokens = prefilling = 0
        sampling: list[Part] = []
        for part in parts:
            if part.sample:
                sampling.append(part)
            if part.draft:
                continue  # how much of it stays in the cache is known after verifying
            job, n_tokens = part.job, len(part.tokens)
            job.slot.tokens.extend(part.tokens)
            job.n_past += n_tokens
            if part.prefill:
                job.prompt_pos += n_tokens
                job.clock.evaluated_tokens += n_tokens
                prefill_tokens += n_tokens
                prefilling += 1
            elif part.sample:
                decode_tokens += 1  # a generating sequence's one token
        emitted, drafted, accepted = self._sample(sampling)
        n_sequences = len(parts) - prefilling
        self._meter.record_step(
            time.perf_counter(),
            prefill_tokens,
            decode_tokens + emitted,
            n_sequences,
            drafted,
            accepted,
        )

    def _sample(self, parts: list[Part]) -> tuple[int, int, int]:
        """Sample and emit the token of each part that wants one, verifying drafts: (tokens
        the drafted runs emitted, tokens drafted, drafted tokens kept)."""
        drafting = self._drafting
        if drafting is None or not any(part.draft for part in parts):
            jobs = [part.job for part in parts]
            if jobs and all(job.chain.plain_greedy for job in jobs):
                self._emitter.sample_greedy(jobs, len(jobs))
            else:
                self._emitter.sample_each(jobs)
            return 0, 0, 0
        self._emitter.sample_each([part.job for part in parts if not part.draft])
        emitted = drafted = accepted = 0
        for part in parts:
            if part.draft:
                n_emitted, kept = drafting.verify(part)
                emitted += n_emitted
                drafted += len(part.draft)
                accepted += kept
        return emitted, drafted, accepted

    def _recover(self, parts: list[Part], status: int) -> None:
        """Roll the failed step back, then retry each sequence alone to find the culprit."""
        log.warning("llama_decode failed (status %d) for %d sequences", status, len(parts))
        for part in parts:
            if not self._slots.rollback(part.job.slot, part.job.n_past):
                self._fail(part.job, f"llama.cpp failed to decode (status {status})")
        survivors = [part for part in parts if not part.job.released]
        if len(parts) == 1:
            if survivors:
                self._fail(parts[0].job, f"llama.cpp failed to decode (status {status})")
            return
        for part in survivors:
            alone = self._context.decode(self._fill([part]))
            if alone != 0:
                self._slots.rollback(part.job.slot, part.job.n_past)
                self._fail(part.job, f"llama.cpp failed to decode (status {alone})")
            else:
                self._after_decode([part])

    # --- a request's turns ------------------------------------------------------------------

    def _started(self, job: AdmittedJob) -> None:
        """The request's prompt is read (its first token came): it generates from now on."""
        job.clock.first_token = time.perf_counter()
        self._meter.record_first_token(job.clock.first_token - job.clock.submitted)
        self._prefilling.remove(job)
        bisect.insort(self._decoding, job, key=seq_id)

    def _fail(self, job: AdmittedJob, message: str) -> None:
        if not job.released:
            self._slots.clear(job.slot)  # its cache may be half-written
        self._finish(job, "error", error=message)

    def _finish(
        self, job: Job, reason: FinishReason, error: str | None = None, fatal: bool = False
    ) -> None:
        clock = job.clock
        clock.finished = time.perf_counter()
        job.chain.close()
        if isinstance(job, AdmittedJob):
            self._release(job)
        self._meter.record_finish(reason)
        job.handle.finished = True
        job.handle.push_finish(FinishEvent(reason, clock.stats(), error, fatal=fatal))

    def _release(self, job: AdmittedJob) -> None:
        """Give the job's slot back and take it off the step's lists."""
        if not job.released:
            if job.images is not None and job.images.rows_done:  # cut inside an image
                self._slots.rollback(job.slot, job.n_past)  # the cache holds whole ones only
            self._slots.release(job.slot)
            job.released = True
        if job in self._decoding:
            self._decoding.remove(job)
        elif job in self._prefilling:
            self._prefilling.remove(job)
