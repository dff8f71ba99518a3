"""Engine metrics: per-request timings and engine-wide rolling throughput, published.

The scheduler (on the compute lane) records what each step did
(:meth:`EngineMeter.record_step`) and when requests start, produce their first token and
finish. :class:`RequestClock` turns one request's timestamps into
:class:`~homelab.engine.api.RequestStats`. Subscribers (the TUI, the server's ``/metrics``)
get an :class:`~homelab.engine.api.EngineMetrics` snapshot from the lane at their own
steady interval — coalesced, never once per token, and without polling the engine's
internals.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from homelab.engine.api import EngineMetrics, RequestStats

log = logging.getLogger("homelab.engine")

ROLLING_WINDOW_S = 3.0

MetricsCallback = Callable[[EngineMetrics], None]
T = TypeVar("T")


@dataclass
class RequestClock:
    """Timestamps (time.perf_counter) and counts of one request."""

    submitted: float
    prompt_tokens: int
    started: float = 0.0  # placed in a slot
    first_token: float = 0.0
    finished: float = 0.0
    cached_tokens: int = 0
    evaluated_tokens: int = 0  # prompt tokens actually put into llama_decode
    completion_tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    def stats(self) -> RequestStats:
        end = self.finished or time.perf_counter()
        started = self.started or end
        first = self.first_token or 0.0
        prefill_s = (first - started) if first else 0.0
        decode_s = end - first if first else 0.0
        decoded_after_first = max(0, self.completion_tokens - 1)
        return RequestStats(
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            completion_tokens=self.completion_tokens,
            ttft_s=(first - self.submitted) if first else 0.0,
            prefill_tok_s=_rate(self.evaluated_tokens, prefill_s),
            decode_tok_s=_rate(decoded_after_first, decode_s),
            queue_s=started - self.submitted,
            evaluated_tokens=self.evaluated_tokens,
            draft_tokens=self.draft_tokens,
            accepted_draft_tokens=self.accepted_draft_tokens,
        )


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 and count > 0 else 0.0


BUCKET_S = 0.25  # the rolling window's resolution: steps are summed per bucket, not kept


class _Bucket:
    """What the steps of one ``BUCKET_S`` did, for the rolling rates (a step adds to the
    open bucket: no allocation per step)."""

    __slots__ = ("accepted", "decode", "drafted", "prefill", "sequences", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.prefill = self.decode = self.sequences = self.drafted = self.accepted = 0


@dataclass
class _Subscriber:
    callback: MetricsCallback
    interval_s: float
    next_due: float


STEP_PHASES = (
    "admit", "draft", "batch", "decode", "sample", "detokenize", "stop", "handoff", "emit",
)  # fmt: skip
PER_TOKEN_PHASES = ("detokenize", "stop", "handoff")  # timed inside the emit of each token


class StepProfile:
    """Where a scheduler step's time goes, per phase (a debug measurement: an engine loaded
    with ``profile_steps``, or ``HOMELAB_PROFILE_STEPS=1``, times its steps; others never
    call the clock for it). ``admit``: queued calls, cancellations, admissions; ``draft``:
    the speculator; ``batch``: planning and filling the llama_batch; ``decode``:
    ``llama_decode``; ``sample``: the sampler chains; ``detokenize``: token bytes to
    complete UTF-8 text; ``stop``: the stop-string matcher; ``handoff``: the events handed
    to the request handles (a reader woken from there); ``emit``: the rest after the decode
    (bookkeeping, finishing requests, the metrics). A profiled step always takes the
    scheduler's general path (parts, then the batch built from them), never the shortcut of
    a step in which every sequence generates (``Scheduler._generate``): a few µs more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = dict.fromkeys(STEP_PHASES, 0.0)
        self._steps = 0

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._seconds[phase] += seconds

    def timing(self, phase: str, function: Callable[..., T]) -> Callable[..., T]:
        """``function``, its time added to ``phase`` at every call."""

        def timed(*args: Any) -> T:
            started = time.perf_counter()
            try:
                return function(*args)
            finally:
                self.add(phase, time.perf_counter() - started)

        return timed

    def total(self, phase: str) -> float:
        with self._lock:
            return self._seconds[phase]

    def step_done(self) -> None:
        with self._lock:
            self._steps += 1

    def per_step_us(self) -> dict[str, float]:
        with self._lock:
            steps = max(self._steps, 1)
            return {phase: 1e6 * total / steps for phase, total in self._seconds.items()}


class EngineMeter:
    """Engine-wide counters and rolling throughput; thread-safe reads, one writer."""

    def __init__(self, n_slots: int, kv_cells_total: int, speculation: str | None = None) -> None:
        self.n_slots = n_slots
        self.kv_cells_total = kv_cells_total
        self.speculation = speculation
        self._lock = threading.Lock()
        self._window: deque[_Bucket] = deque()
        self._bucket_ends = -math.inf  # when the open bucket (the window's last) closes
        self._open = _Bucket(-math.inf)  # the bucket steps add to (a placeholder until one)
        self._by_status: Counter[str] = Counter()
        self._subscribers: dict[int, _Subscriber] = {}
        self._next_id = 0
        self.requests_total = 0
        self.steps_total = 0
        self.prefill_tokens_total = 0
        self.decode_tokens_total = 0
        self.draft_tokens_total = 0
        self.accepted_draft_tokens_total = 0
        self.last_ttft_s: float | None = None
        # read at snapshot time (not written per step): (busy slots, KV cells used), the queue
        self.live_occupancy: Callable[[], tuple[int, int]] | None = None
        self.live_queue_depth: Callable[[], int] | None = None
        self.earliest_due = math.inf  # the next subscriber's due time (read without the lock)
        self.step_profile: StepProfile | None = None  # set when the engine profiles its steps

    # --- written by the scheduler, on the lane -----------------------------------------------

    def record_step(
        self,
        now: float,
        prefill_tokens: int,
        decode_tokens: int,
        sequences: int = 0,
        drafted: int = 0,
        accepted: int = 0,
    ) -> None:
        """One step: prompt tokens evaluated, tokens emitted by the ``sequences`` that were
        generating, and how many drafted tokens they verified and kept. The lane is the only
        writer: the counters are added to without the lock (a reader may miss the step being
        written), which is taken only to open a new bucket (every ``BUCKET_S``)."""
        self.steps_total += 1
        self.prefill_tokens_total += prefill_tokens
        self.decode_tokens_total += decode_tokens
        self.draft_tokens_total += drafted
        self.accepted_draft_tokens_total += accepted
        bucket = self._open if now < self._bucket_ends else self._open_bucket(now)
        bucket.prefill += prefill_tokens
        bucket.decode += decode_tokens
        bucket.sequences += sequences
        bucket.drafted += drafted
        bucket.accepted += accepted

    def record_generating_step(self, now: float, n_sequences: int) -> None:
        """``record_step(now, 0, n_sequences, n_sequences)``: a step in which each of
        ``n_sequences`` generating sequences gained one token (nearly every step; the fewer
        counters it touches, the less it costs)."""
        self.steps_total += 1
        self.decode_tokens_total += n_sequences
        bucket = self._open if now < self._bucket_ends else self._open_bucket(now)
        bucket.decode += n_sequences
        bucket.sequences += n_sequences

    def _open_bucket(self, now: float) -> _Bucket:
        bucket = _Bucket(now)
        with self._lock:
            self._window.append(bucket)
            self._bucket_ends = now + BUCKET_S
            self._open = bucket
            self._trim(now)
        return bucket

    def record_first_token(self, ttft_s: float) -> None:
        self.last_ttft_s = ttft_s

    def record_finish(self, status: str) -> None:
        with self._lock:
            self.requests_total += 1
            self._by_status[status] += 1

    def record_rejected(self) -> None:
        with self._lock:
            self._by_status["rejected"] += 1

    def _trim(self, now: float) -> None:
        while self._window and self._window[0].start < now - ROLLING_WINDOW_S:
            self._window.popleft()
        if not self._window:
            self._bucket_ends = -math.inf

    # --- read from any thread -------------------------------------------------------------

    def snapshot(self) -> EngineMetrics:
        now = time.perf_counter()
        with self._lock:
            self._trim(now)
            prefill = sum(step.prefill for step in self._window)
            decode = sum(step.decode for step in self._window)
            sequences = sum(step.sequences for step in self._window)
            drafted = sum(step.drafted for step in self._window)
            accepted = sum(step.accepted for step in self._window)
            span = self._span(now)
            by_status = dict(self._by_status)
            requests_total = self.requests_total
            steps = self.steps_total
        active_slots, kv_cells_used = self.live_occupancy() if self.live_occupancy else (0, 0)
        return EngineMetrics(
            prefill_tok_s=prefill / span if span else 0.0,
            decode_tok_s=decode / span if span else 0.0,
            active_slots=active_slots,
            n_slots=self.n_slots,
            queue_depth=self.live_queue_depth() if self.live_queue_depth else 0,
            kv_cells_used=kv_cells_used,
            kv_cells_total=self.kv_cells_total,
            requests_total=requests_total,
            requests_by_status=by_status,
            last_ttft_s=self.last_ttft_s,
            steps_total=steps,
            prefill_tokens_total=self.prefill_tokens_total,
            decode_tokens_total=self.decode_tokens_total,
            speculation=self.speculation,
            draft_tokens_total=self.draft_tokens_total,
            accepted_draft_tokens_total=self.accepted_draft_tokens_total,
            acceptance_rate=accepted / drafted if drafted else None,
            tokens_per_target_step=decode / sequences if sequences else None,
            step_phases_us=self.step_profile.per_step_us() if self.step_profile else None,
        )

    def _span(self, now: float) -> float:
        """Seconds the rolling rates are averaged over (the window, or less at start)."""
        if not self._window:
            return 0.0
        return max(min(ROLLING_WINDOW_S, now - self._window[0].start), 0.25)

    # --- subscriptions ---------------------------------------------------------------------

    def subscribe(self, callback: MetricsCallback, interval_s: float) -> Callable[[], None]:
        interval_s = max(0.05, float(interval_s))
        with self._lock:
            key = self._next_id
            self._next_id += 1
            self._subscribers[key] = _Subscriber(callback, interval_s, time.perf_counter())
            self._note_earliest_due()

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(key, None)
                self._note_earliest_due()

        return unsubscribe

    def _note_earliest_due(self) -> None:  # under the lock
        dues = [sub.next_due for sub in self._subscribers.values()]
        self.earliest_due = min(dues) if dues else math.inf

    def seconds_until_due(self, now: float) -> float | None:
        earliest = self.earliest_due
        return None if earliest == math.inf else max(0.0, earliest - now)

    def publish_due(self, now: float) -> None:
        """Called by the engine thread: give each due subscriber the current snapshot (a
        float comparison when none is due: this runs every step)."""
        if now < self.earliest_due:
            return
        with self._lock:
            due = [sub for sub in self._subscribers.values() if sub.next_due <= now]
            for sub in due:
                sub.next_due = max(sub.next_due + sub.interval_s, now)
            self._note_earliest_due()
        if not due:
            return
        snapshot = self.snapshot()
        for sub in due:
            try:
                sub.callback(snapshot)
            except Exception:  # a broken subscriber must not stop the engine
                log.exception("a metrics subscriber failed")
