"""Speculative decoding: draft a few tokens per sequence, let the target verify them in bulk.

Decode is bound by reading the weights once per step, and a step with ``k + 1`` rows for a
sequence costs little more than one row, so each sequence may propose ``k`` tokens that the
target checks in the same ``llama_decode`` as everyone else's normal step
(:mod:`homelab.engine.speculation.acceptance` decides what is kept). Two kinds of draft:

``ngram`` (prompt lookup)
    Copies what followed the sequence's latest repeated n-gram
    (:mod:`homelab.engine.speculation.lookup`).
``draft``
    A small model with the same vocabulary on its own llama.cpp context, one sequence per
    slot (:mod:`homelab.engine.speculation.draft_model`).

How many tokens to draft is decided per step by
:class:`~homelab.engine.speculation.policy.DraftPolicy`, which measures whole steps at each
draft length and plays the fastest — ``0`` (plain decoding) when speculation loses. What
cannot speculate is refused before loading (:mod:`homelab.engine.speculation.refusals`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from homelab.engine.api import SamplingParams
from homelab.engine.speculation.acceptance import Proposal
from homelab.engine.speculation.config import SpeculationConfig, SpeculationKind
from homelab.engine.speculation.lookup import NgramDrafter
from homelab.engine.speculation.policy import DraftPolicy
from homelab.engine.speculation.sequence import DraftRequest, SequenceSpeculation

if TYPE_CHECKING:
    from homelab.engine.speculation.draft_model import DraftModel


@dataclass
class _StepTally:
    """One engine step, from the proposal to the end of the target's decode."""

    started: float
    n_sequences: int
    drafting: int  # sequences that proposed a draft
    tokens: int  # emitted so far: one per plain sequence, accepted + 1 per drafting one
    unsettled: int = 0  # drafts whose verdict has not come yet

    def __post_init__(self) -> None:
        self.unsettled = self.drafting


class Speculator:
    """Proposes drafts for the scheduler and learns from the verdicts."""

    def __init__(
        self,
        config: SpeculationConfig,
        eog_tokens: frozenset[int],
        draft_model: DraftModel | None = None,
    ) -> None:
        self.config = config = config.checked()
        self.policy = DraftPolicy(config.max_draft_tokens, adaptive=config.adaptive)
        self.draft_model = draft_model
        self._eog = eog_tokens
        self._step: _StepTally | None = None  # the step being measured whole

    @property
    def kind(self) -> SpeculationKind:
        return self.config.kind

    def start(self, seq_id: int, prompt: Sequence[int], n_cached: int, sampling: SamplingParams,
              tenant: str) -> SequenceSpeculation:  # fmt: skip
        """A request of ``tenant`` was placed in slot ``seq_id`` with ``n_cached`` prompt tokens
        reused."""
        state = SequenceSpeculation()
        if self.config.kind == "ngram":
            state.drafter = NgramDrafter(self.config.ngram_min, self.config.ngram_max)
        else:
            assert self.draft_model is not None
            self.draft_model.admit(seq_id, prompt, n_cached, tenant)
            if sampling.temperature > 0:
                state.rng = np.random.default_rng(sampling.seed)
        return state

    def propose(self, requests: list[DraftRequest], room: int) -> None:
        """Set each request's ``state.proposal`` (None: decode plainly this step)."""
        started = time.perf_counter()
        for request in requests:
            request.state.proposal = None
        if self.draft_model is None:
            self._lookup(requests, room)
        else:
            self._draft(requests, room)
        drafting = sum(1 for request in requests if request.state.proposal is not None)
        self._step = _StepTally(started, len(requests), drafting, len(requests) - drafting)

    def _plan(self, requests: list[DraftRequest], limits: list[int], room: int) -> None:
        sequences = [
            (request.state.acceptance, limit)
            for request, limit in zip(requests, limits, strict=True)
        ]
        for request, length in zip(requests, self.policy.plan(sequences, room), strict=True):
            request.k = length

    def _lookup(self, requests: list[DraftRequest], room: int) -> None:
        """Prompt lookup: find every sequence's continuation first (it is cheap), then let
        the policy decide how much of each to verify."""
        found: list[tuple[int, ...]] = []
        for request in requests:
            drafter = request.state.drafter
            assert drafter is not None
            drafter.sync(request.evaluated, request.last)
            found.append(drafter.propose(min(request.limit, self.config.max_draft_tokens)))
        self._plan(requests, [len(tokens) for tokens in found], room)
        for request, tokens in zip(requests, found, strict=True):
            if request.k > 0:
                request.state.proposal = Proposal(tokens[: request.k])

    def _draft(self, requests: list[DraftRequest], room: int) -> None:
        assert self.draft_model is not None
        self._plan(requests, [request.limit for request in requests], room)
        drafting = [request for request in requests if request.k > 0]
        if drafting:
            self.draft_model.draft(drafting, self._eog)

    def end_step(self) -> None:
        """A decode-only step ended, its tokens emitted: the policy measures it whole."""
        step, self._step = self._step, None
        if step is not None and step.unsettled == 0:  # every draft of it was verified
            seconds = time.perf_counter() - step.started
            self.policy.observe_step(step.n_sequences, step.tokens, seconds)

    def settle(self, state: SequenceSpeculation, drafted: int, accepted: int) -> None:
        step = self._step
        if step is not None:
            step.tokens += accepted + 1
            step.unsettled -= 1
        self.policy.settle(state.acceptance, drafted, accepted)

    def close(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()
