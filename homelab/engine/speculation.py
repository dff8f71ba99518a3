"""Speculative decoding: draft a few tokens per sequence, let the target verify them in bulk.

Decode is bound by reading the weights once per step, and a step with ``k + 1`` rows for a
sequence costs little more than one row, so each sequence may propose ``k`` tokens that the
target checks in the same ``llama_decode`` as everyone else's normal step
(:mod:`homelab.engine.acceptance` decides what is kept). Two kinds of draft:

``ngram`` (prompt lookup)
    The longest recent n-gram (``ngram_max`` down to ``ngram_min`` tokens) that occurred
    before in the prompt or the text so far proposes the tokens that followed it. Free to
    compute; strong on text that repeats (code edits, quoting, summaries, loops).
``draft``
    A small model with the same vocabulary on its own llama.cpp context, one sequence per
    slot (:mod:`homelab.engine.draft_model`).

How many tokens to draft is decided per step by
:class:`~homelab.engine.draft_policy.DraftPolicy`, which measures whole steps at each draft
length and plays the fastest — ``0`` (plain decoding) when speculation loses.
Rejected tokens are dropped from both caches, so a target whose memory cannot drop a suffix
(recurrent and hybrid models) is refused, as is a sliding-window cache that is trimmed
(``swa_full`` off), and a draft whose vocabulary is not the target's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from homelab.engine.acceptance import Proposal
from homelab.engine.api import SamplingParams
from homelab.engine.draft_policy import Acceptance, DraftPolicy
from homelab.errors import EngineError
from homelab.llamacpp.vocab import Vocab

if TYPE_CHECKING:
    from homelab.engine.draft_model import DraftModel

SpeculationKind = Literal["ngram", "draft"]
KINDS: tuple[SpeculationKind, ...] = ("ngram", "draft")
MAX_DRAFT_TOKENS = 32


class SpeculationError(EngineError):
    """Speculative decoding was asked for but cannot be done with these models."""

    title = "Speculative decoding unavailable"


@dataclass(frozen=True)
class SpeculationConfig:
    """How an engine speculates (``Engine.load(..., speculation=...)``)."""

    kind: SpeculationKind = "ngram"
    draft_path: str | Path | None = None  # the draft model's GGUF (kind "draft")
    max_draft_tokens: int = 8  # the most tokens drafted per sequence and step
    adaptive: bool = True  # False: always draft max_draft_tokens (when there is a draft)
    ngram_min: int = 2  # prompt lookup: shortest n-gram that may propose tokens
    ngram_max: int = 4
    draft_gpu_layers: int | None = None  # None: as many as the target's plan offloads
    draft_p_min: float = 0.0  # greedy drafts stop when the draft's top probability is lower

    def checked(self) -> SpeculationConfig:
        if self.kind not in KINDS:
            raise SpeculationError(
                f"unknown speculation kind {self.kind!r}", hint="Use 'ngram' or 'draft'."
            )
        if self.kind == "draft" and not self.draft_path:
            raise SpeculationError(
                "speculation with a draft model needs the draft's path",
                hint="Pass draft_path (a GGUF with the target's vocabulary).",
            )
        if not 1 <= self.max_draft_tokens <= MAX_DRAFT_TOKENS:
            raise SpeculationError(
                f"max_draft_tokens must be between 1 and {MAX_DRAFT_TOKENS} "
                f"(got {self.max_draft_tokens})"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise SpeculationError(
                f"need 1 <= ngram_min <= ngram_max (got {self.ngram_min}, {self.ngram_max})"
            )
        return self

    def describe(self) -> str:
        if self.kind == "ngram":
            return f"prompt lookup (n-grams {self.ngram_min}-{self.ngram_max})"
        return f"draft model {Path(str(self.draft_path)).name}"


# --- refusals ------------------------------------------------------------------------------


def check_target(arch: str, *, recurrent: bool, n_swa: int, swa_full: bool) -> None:
    """Refuse targets whose cache cannot drop rejected draft tokens."""
    if recurrent:
        raise SpeculationError(
            f"speculative decoding needs a target that can drop rejected draft tokens, but "
            f"this {arch} model keeps a recurrent state (Mamba, RWKV and hybrids cannot be "
            "rolled back partially in llama.cpp)",
            hint="Run it without speculation.",
        )
    if n_swa > 0 and not swa_full:
        raise SpeculationError(
            f"speculative decoding cannot roll back this model's trimmed sliding-window cache "
            f"(window {n_swa}): llama.cpp reuses cells the window no longer needs while a "
            "draft is being verified",
            hint="Load it with swa_full on (a full-size sliding-window cache) to speculate.",
        )


def check_draft_model(path: Path, *, recurrent: bool) -> None:
    if recurrent:
        raise SpeculationError(
            f"the draft model {path.name} keeps a recurrent state, which llama.cpp cannot "
            "roll back after a rejected draft",
            hint="Use a transformer draft model.",
        )


VOCAB_SLACK = 128  # padded vocabularies of one family differ by a few unused ids
FULL_COMPARE_LIMIT = 32768  # compare every token text up to this size, a sample above


def check_vocabularies(target: Vocab, draft: Vocab, draft_name: str) -> None:
    """Refuse a draft whose tokens are not the target's (same ids, same texts)."""

    def refuse(problem: str) -> SpeculationError:
        return SpeculationError(
            f"the draft model {draft_name} cannot draft for this target: {problem}",
            hint="Use a draft from the same model family (the same tokenizer).",
        )

    if target.kind != draft.kind:
        raise refuse(f"its tokenizer type is {draft.kind}, the target's is {target.kind}")
    if abs(target.n_tokens - draft.n_tokens) > VOCAB_SLACK:
        raise refuse(f"it has {draft.n_tokens} tokens, the target {target.n_tokens}")
    for name in ("bos", "eos", "adds_bos", "adds_eos"):
        if getattr(target, name) != getattr(draft, name):
            raise refuse(f"{name} is {getattr(draft, name)!r}, the target's is "
                         f"{getattr(target, name)!r}")  # fmt: skip
    for token in _tokens_to_compare(min(target.n_tokens, draft.n_tokens)):
        mine, theirs = (
            target.token_bytes(token, special=True),
            draft.token_bytes(token, special=True),
        )
        if mine != theirs:
            raise refuse(f"token {token} is {theirs!r} in the draft but {mine!r} in the target")


def _tokens_to_compare(n_common: int) -> range | list[int]:
    if n_common <= FULL_COMPARE_LIMIT:
        return range(n_common)
    stride = n_common // 4096
    sample = set(range(0, 1024)) | set(range(n_common - 1024, n_common))
    return sorted(sample | set(range(0, n_common, stride)))


# --- prompt lookup -------------------------------------------------------------------------


class NgramDrafter:
    """Prompt lookup over one sequence's tokens (the prompt plus what it generated).

    For every n in ``[n_min, n_max]`` a table maps each n-gram to the position after its most
    recent occurrence that has a continuation. Looking up the sequence's last n tokens (longest
    n first) gives where to copy from; when the copy runs into the end of the sequence it
    continues with the period it found (a repeating loop keeps proposing its next turn).
    """

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.history: list[int] = []
        self._follows: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(n_min, n_max + 1)
        }

    def sync(self, evaluated: Sequence[int], last: int) -> None:
        """Catch up with the sequence ``evaluated + [last]`` (which only ever grows)."""
        done = len(self.history)
        if done < len(evaluated):
            for token in evaluated[done:]:
                self._append(token)
        if len(self.history) == len(evaluated):
            self._append(last)

    def _append(self, token: int) -> None:
        history = self.history
        end = len(history)  # the n-grams ending just before `token` now have a follower
        for n, table in self._follows.items():
            if end >= n:
                table[tuple(history[end - n : end])] = end
        history.append(token)

    def propose(self, k: int) -> tuple[int, ...]:
        history = self.history
        size = len(history)
        for n in range(self.n_max, self.n_min - 1, -1):
            if size < n:
                continue
            start = self._follows[n].get(tuple(history[size - n :]))
            if start is not None:
                period = size - start
                return tuple(history[start + i % period] for i in range(k))
        return ()


# --- the scheduler's side ------------------------------------------------------------------


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


@dataclass(eq=False)
class SequenceSpeculation:
    """One request's speculation state."""

    acceptance: Acceptance = field(default_factory=Acceptance)
    drafter: NgramDrafter | None = None
    rng: np.random.Generator | None = None  # sampled drafts: the acceptance rule's randomness
    proposal: Proposal | None = None  # this step's draft


@dataclass(eq=False)
class DraftRequest:
    """What the speculator needs of one decoding sequence this step."""

    seq_id: int
    evaluated: list[int]  # tokens in the target's cache (the slot's tokens)
    last: int  # sampled, not evaluated yet
    limit: int  # the most tokens it may draft (max_tokens, context)
    sampling: SamplingParams
    state: SequenceSpeculation
    k: int = 0


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

    def start(self, seq_id: int, prompt: Sequence[int], n_cached: int, sampling: SamplingParams
              ) -> SequenceSpeculation:  # fmt: skip
        """A request was placed in slot ``seq_id`` with ``n_cached`` prompt tokens reused."""
        state = SequenceSpeculation()
        if self.config.kind == "ngram":
            state.drafter = NgramDrafter(self.config.ngram_min, self.config.ngram_max)
        else:
            assert self.draft_model is not None
            self.draft_model.admit(seq_id, prompt, n_cached)
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
