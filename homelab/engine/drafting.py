"""The step's side of speculative decoding: drafts asked for before the batch, checked after.

With a speculator (``homelab.engine.speculation``) a generating sequence may bring a draft:
its row becomes ``[last, d0 … dk-1]`` with logits at every position, in the same
``llama_decode`` as everyone else. After the decode the target's sampler keeps the agreeing
prefix (``speculation.acceptance``), the rejected positions are dropped from the cache, and
the kept tokens are emitted one by one through the same path as a plain token
(:meth:`homelab.engine.emit.Emitter.emit`) — so a stop string, max_tokens, an
end-of-generation token or a cancellation in the middle of an accepted draft ends the
stream exactly where plain decoding would. Drafting never fails a sequence: a speculator
error costs that step its drafts.

This module sits over the job types (``job``), which the ``speculation`` package lies below,
so it lives beside the scheduler rather than inside that package.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from homelab.engine.api import FinishReason
from homelab.engine.emit import Emitter
from homelab.engine.job import AdmittedJob, Part, SchedulerConfig
from homelab.engine.slots import SlotTable
from homelab.engine.speculation.acceptance import verify
from homelab.engine.speculation.sequence import DraftRequest
from homelab.engine.speculation.speculator import Speculator
from homelab.llamacpp.context import Context

log = logging.getLogger("homelab.engine")


class Drafting:
    """Drafts for a scheduler's generating sequences, and their verification."""

    def __init__(
        self,
        speculator: Speculator,
        context: Context,
        slots: SlotTable,
        config: SchedulerConfig,
        emitter: Emitter,
        finish: Callable[[AdmittedJob, FinishReason], None],
        fail: Callable[[AdmittedJob, str], None],
    ) -> None:
        self._speculator = speculator
        self._context = context
        self._slots = slots
        self._config = config
        self._emitter = emitter
        self._finish = finish
        self._fail = fail

    def start(self, job: AdmittedJob, n_cached: int) -> None:
        """A placed job (a text prompt) speculates from now on."""
        job.spec = self._speculator.start(
            job.slot.seq_id, job.prompt, n_cached, job.request.sampling, job.request.tenant
        )

    def end_step(self) -> None:
        """A decode-only step ended: the speculator measures it."""
        self._speculator.end_step()

    # --- before the batch -----------------------------------------------------------------

    def propose(self, decoding: list[AdmittedJob], prefilling: Sequence[AdmittedJob]) -> None:
        """Let the speculator draft for the generating sequences (never fatal to them)."""
        if not decoding:
            return
        # in slot order; a prompt with images does not speculate
        requests = [self._draft_request(job) for job in decoding if job.spec is not None]
        reserve = self._config.prefill_chunk_tokens if prefilling else 0
        room = self._config.n_batch - len(decoding) - reserve
        try:
            self._speculator.propose(requests, room)
        except Exception:
            log.exception("drafting failed; decoding without drafts this step")
            for request in requests:
                request.state.proposal = None

    def _draft_request(self, job: AdmittedJob) -> DraftRequest:
        assert job.spec is not None
        remaining = job.max_tokens - job.clock.completion_tokens  # tokens it may still emit
        room = self._config.n_ctx_per_slot - job.n_past  # cells left for [last, *draft]
        limit = min(remaining, room) - 1
        return DraftRequest(
            job.slot.seq_id, job.slot.tokens, job.last_token, limit, job.request.sampling, job.spec
        )

    # --- after the decode -----------------------------------------------------------------

    def verify(self, part: Part) -> tuple[int, int]:
        """Verify a draft and emit what it keeps: (tokens emitted, drafted tokens kept)."""
        try:
            return self._verify(part)
        except Exception as exc:
            log.exception("verifying a draft failed for request %s", part.job.handle.request_id)
            if not part.job.released:
                self._fail(part.job, f"sampling failed: {exc}")
            return 0, 0

    def _verify(self, part: Part) -> tuple[int, int]:
        job = part.job
        spec, slot = job.spec, job.slot
        assert spec is not None and spec.proposal is not None
        proposal, spec.proposal = spec.proposal, None
        ignore_eos = job.request.sampling.ignore_eos
        rows = range(part.first_row, part.first_row + len(part.tokens))
        if job.before_min_tokens():  # the whole run: a draft rarely crosses min_tokens
            for row in rows:
                self._emitter.ban_eog(row)
        eog = self._emitter.eog_tokens
        verdict = verify(
            job.chain,
            self._context,
            rows,
            proposal,
            lambda token: token in eog and not ignore_eos,
            spec.rng,
        )
        keep = len(verdict.tokens)  # the cache holds [last, *draft]: keep [last, *kept]
        slot.tokens.extend(part.tokens[:keep])
        job.n_past += keep
        if keep < len(part.tokens) and not self._slots.rollback(slot, job.n_past):
            self._fail(job, "llama.cpp could not drop the rejected draft tokens")
            return 0, verdict.accepted
        self._speculator.settle(spec, len(part.draft), verdict.accepted)
        job.clock.draft_tokens += len(part.draft)
        emitted = self._emit_kept(job, verdict.tokens, verdict.accepted, part.first_row)
        return emitted, verdict.accepted

    def _emit_kept(
        self, job: AdmittedJob, tokens: tuple[int, ...], accepted: int, first_row: int
    ) -> int:
        """Emit a verified run one token at a time, as plain decoding would; stop where the
        request ends (stop string, max_tokens, end of generation, or a cancellation)."""
        for index, token in enumerate(tokens):
            if index > 0 and job.handle.cancelled:
                self._finish(job, "cancelled")
                return index
            if index < accepted:
                job.clock.accepted_draft_tokens += 1
            if not self._emitter.emit(job, token, first_row + index):
                return index + 1
        return len(tokens)
