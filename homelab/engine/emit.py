"""A step's sampled tokens to their requests: one emit path, two ways to pick.

After a decode, each sampling sequence's next token is picked one of two ways — the named
variants of the step's sampling:

- :meth:`Emitter.sample_greedy`: every sequence samples plain greedy (no grammar, penalties,
  biases or log-probabilities), so one numpy argmax over the step's logits picks every token
  (~2 µs against ~5 µs for a sampler call over 1,024 tokens, ~30 against ~80 over 32,000);
- :meth:`Emitter.sample_each`: each sequence from its own logits row with its own C sampler
  chain;

and every token — drafted runs kept by verification included — goes through the one
:meth:`Emitter.emit`: text (complete UTF-8 only), stop strings held back, log-probabilities,
the end (end of generation, a stop string, max_tokens), handed to the request's handle.

Every step pays for each Python call it makes (~10x its cost in a loop: the decode in between
leaves the CPU's caches cold; tests/engine/test_step_overhead.py counts them), so
:meth:`Emitter.emit` takes most tokens — text and nothing else — in its first branch, and the
rest the long way (where a profiled engine times each part: detokenize, stop, handoff).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from homelab.engine.api import FinishReason, TokenEvent, TokenLogprob, new_token_event
from homelab.engine.job import AdmittedJob
from homelab.engine.metrics import StepProfile
from homelab.engine.sampling import top_logprobs
from homelab.engine.text import StopMatcher
from homelab.llamacpp.context import Context
from homelab.llamacpp.vocab import Vocab

log = logging.getLogger("homelab.engine")


class Emitter:
    """Picks each sampling sequence's token after a decode and hands it to its request."""

    def __init__(
        self,
        context: Context,
        vocab: Vocab,
        eog_tokens: frozenset[int],
        profile: StepProfile | None,
        started: Callable[[AdmittedJob], None],
        finish: Callable[[AdmittedJob, FinishReason], None],
        fail: Callable[[AdmittedJob, str], None],
    ) -> None:
        self._context = context
        self._vocab = vocab
        self._eog = self.eog_tokens = eog_tokens
        self._eog_ids = np.fromiter(sorted(eog_tokens), dtype=np.int64, count=len(eog_tokens))
        self._profile = profile  # time the per-token parts (debug metrics), or not at all
        self._started = started  # the request's first token: it generates from now on
        self._finish = finish
        self._fail = fail
        self._pieces: dict[int, bytes] = {}
        self._whole_texts: dict[int, str] = {}  # see piece()
        self._detokenize: Callable[[AdmittedJob, int], str] = self._token_text
        self._match_stops: Callable[[StopMatcher, str], tuple[str, bool]] = StopMatcher.feed
        self._hand_over: Callable[[AdmittedJob, TokenEvent], None] = _push
        if profile is not None:  # the per-token parts of emitting, each its own phase
            self._detokenize = profile.timing("detokenize", self._detokenize)
            self._match_stops = profile.timing("stop", self._match_stops)
            self._hand_over = profile.timing("handoff", self._hand_over)

    # --- picking: the two variants ------------------------------------------------------------

    def sample_greedy(self, jobs: Sequence[AdmittedJob], n_jobs: int) -> None:
        """Pick every job's token with one argmax over the step's logits (each job's last
        row, in order; ``n_jobs`` of them) and emit it; the caller has seen that every job
        samples plain greedy and brings no draft."""
        logits = self._context.output_logits(n_jobs)
        if logits is None:  # the decode kept no logits (never expected): the long way
            self.sample_each(jobs)
            return
        profile = self._profile
        started = time.perf_counter() if profile is not None else 0.0
        picks = logits.argmax(axis=1).tolist()  # the greedy sampler's pick: the first maximum
        if profile is not None:
            profile.add("sample", time.perf_counter() - started)
        emit, eog = self.emit, self._eog
        for index, job in enumerate(jobs):
            token = picks[index]
            try:
                if token in eog and (job.ignore_eos or job.before_min_tokens()):
                    token = self._pick_without_eog(logits[index])
                emit(job, token, job.batch_index)
            except Exception as exc:
                self._sampling_failed(job, exc)

    def sample_each(self, jobs: Sequence[AdmittedJob]) -> None:
        """Sample each job from its own logits row with its own sampler chain, and emit."""
        context, profile = self._context, self._profile
        for job in jobs:
            row = job.batch_index
            try:
                if job.clock.completion_tokens < job.min_tokens:  # before_min_tokens, inline
                    self.ban_eog(row)
                if profile is None:
                    token = job.chain.sample(context, row)
                else:
                    started = time.perf_counter()
                    token = job.chain.sample(context, row)
                    profile.add("sample", time.perf_counter() - started)
                self.emit(job, token, row)
            except Exception as exc:
                self._sampling_failed(job, exc)

    def _sampling_failed(self, job: AdmittedJob, exc: Exception) -> None:
        log.exception("sampling failed for request %s", job.handle.request_id)
        self._fail(job, f"sampling failed: {exc}")

    def _pick_without_eog(self, row: np.ndarray) -> int:
        """The most likely token of ``row`` once end-of-generation is banned (only asked when
        the plain pick was an end: banning first would cost every step ~10 µs)."""
        row[self._eog_ids] = -np.inf  # nobody reads these logits again
        return int(row.argmax())

    def ban_eog(self, row: int) -> None:
        """End-of-generation tokens cannot be sampled from ``row`` of the last decode."""
        self._context.logits_row(row)[self._eog_ids] = -np.inf

    # --- emitting: one path -------------------------------------------------------------------

    def emit(self, job: AdmittedJob, token: int, row: int) -> bool:
        """Hand one sampled token to the request; False when the request has ended.

        Most tokens are text and nothing else: whole UTF-8 by themselves (``piece`` has
        seen them), no bytes pending, no stop strings or log-probabilities, not the end.
        They take the first branch, the rest of this method in one place (no further
        call a token). Not while the steps are profiled (the phases are timed in the long
        way)."""
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
            self._started(job)
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

    # --- text --------------------------------------------------------------------------------

    def _token_text(self, job: AdmittedJob, token: int) -> str:
        data = self._pieces.get(token)
        if data is None:
            data = self.piece(token)
        return job.utf8.feed(data, self._whole_texts.get(token))

    @staticmethod
    def _release_held(job: AdmittedJob, text: str) -> str:
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

    def _logprob(self, job: AdmittedJob, token: int, row: int) -> TokenLogprob:
        n_top = job.request.sampling.logprobs or 0
        logits = self._context.logits_row(row)
        chosen, top = top_logprobs(logits, token, n_top)
        text = self._display(token)
        return TokenLogprob(text, chosen, tuple((self._display(t), lp) for t, lp in top))

    def _display(self, token: int) -> str:
        return self.piece(token).decode("utf-8", errors="replace")


def _push(job: AdmittedJob, event: TokenEvent) -> None:
    job.handle.push(event)
