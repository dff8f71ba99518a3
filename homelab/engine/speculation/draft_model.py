"""The draft model of speculative decoding: a small model on its own llama.cpp context.

Its context has the target's slot layout — the same ``n_seq_max`` and cells per sequence, one
sequence id per slot — so a slot's draft cache mirrors the target's. Each slot remembers the
tokens in its draft cache and how many at the end are unverified draft tokens. Before
drafting, that tail is compared with what the target kept and cut where they part
(``drop_from``); the tokens the draft has not seen yet are fed in (catch-up), and then one
``llama_decode`` per draft depth extends every drafting sequence by a token at once.

Catch-up is bounded per step (``catch_up_tokens``): a sequence with a long backlog (a new
prompt, or a stretch of plain decoding) feeds a chunk per step and drafts once it is level.
A new request keeps only the draft tokens the target's prefix cache kept for it — nothing
when the draft slot last served another tenant, so the draft cache is as tenant-isolated as
the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from homelab.engine.slots import common_prefix_length
from homelab.engine.speculation.acceptance import Distribution, Proposal
from homelab.engine.speculation.refusals import check_draft_model, check_vocabularies
from homelab.engine.speculation.sequence import DraftRequest
from homelab.errors import EngineError
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context, ContextCreateError, ContextParams
from homelab.llamacpp.model import Model, ModelLoadError, ModelParams
from homelab.llamacpp.vocab import Vocab

SAMPLED_DRAFT_TOP_K = 64  # a sampled draft draws from at most this many candidates


@dataclass
class _DraftSlot:
    tokens: list[int] = field(default_factory=list)  # in the draft cache, by position
    unverified: int = 0  # how many at the end are draft tokens the target has not judged
    tenant: str | None = None  # whose tokens these are


@dataclass(eq=False)
class _Drafting:
    request: DraftRequest
    slot: _DraftSlot
    row: int = -1
    tokens: list[int] = field(default_factory=list)
    q: list[Distribution] = field(default_factory=list)
    done: bool = False


class DraftModel:
    """Owns the draft model and its context; all calls happen on the engine thread."""

    def __init__(
        self, model: Model, context: Context, n_vocab_target: int, catch_up_tokens: int,
        p_min: float = 0.0,
    ) -> None:  # fmt: skip
        self.model = model
        self.context = context
        self.path = model.path
        self._n_vocab_target = n_vocab_target
        self._catch_up = max(1, catch_up_tokens)
        self._p_min = p_min
        self._slots = [_DraftSlot() for _ in range(context.n_seq_max)]
        self._batch = Batch(context.n_batch)

    @classmethod
    def load(
        cls,
        path: str | Path,
        target_vocab: Vocab,
        target_context: ContextParams,
        *,
        n_gpu_layers: int,
        catch_up_tokens: int,
        p_min: float = 0.0,
    ) -> DraftModel:
        """Load the draft beside a target whose context was made with ``target_context``."""
        path = Path(path).expanduser()
        try:
            model = Model.load(path, ModelParams(n_gpu_layers=n_gpu_layers))
        except ModelLoadError as failure:
            raise EngineError(
                f"llama.cpp could not load the draft model {path}: {failure.reason}",
                hint="Check the draft's path; it must be a GGUF llama.cpp can run.",
            ) from None
        try:
            check_draft_model(path, recurrent=model.keeps_recurrent_state)
            check_vocabularies(target_vocab, model.vocab, path.name)
            # a full-size sliding-window cache: rolling back must never lose a needed cell
            context = Context.create(model, replace(target_context, swa_full=True))
        except ContextCreateError as failure:
            model.close()
            raise EngineError(
                f"llama.cpp could not create the draft model's context: {failure.reason}",
                hint="The draft shares the target's context settings (K/V types, flash "
                "attention); choose a draft those suit, or free memory.",
            ) from None
        except BaseException:
            model.close()
            raise
        return cls(model, context, target_vocab.n_tokens, catch_up_tokens, p_min)

    # --- slots ---------------------------------------------------------------------------

    def admit(self, seq_id: int, prompt: Sequence[int], n_cached: int, tenant: str) -> None:
        """A request of ``tenant`` starts in ``seq_id``: keep at most what the target's cache
        kept, and nothing of another tenant's (the target may have restored this tenant's
        prefix into a slot another tenant used last: a draft prefix reused across tenants
        would be timed)."""
        slot = self._slots[seq_id]
        keep = min(common_prefix_length(slot.tokens, prompt), n_cached)
        self._cut(seq_id, keep if slot.tenant == tenant else 0)
        slot.tenant = tenant

    def cached_tokens(self, seq_id: int) -> list[int]:
        """The tokens in ``seq_id``'s draft cache (for tests and diagnostics)."""
        return list(self._slots[seq_id].tokens)

    def _cut(self, seq_id: int, keep: int) -> None:
        slot = self._slots[seq_id]
        if keep >= len(slot.tokens):
            slot.unverified = 0
            return
        memory = self.context.memory
        if keep == 0 or not memory.drop_from(seq_id, keep):
            memory.clear_sequence(seq_id)
            keep = 0
        del slot.tokens[keep:]
        slot.unverified = 0

    def _level(self, request: DraftRequest) -> int:
        """Cut the slot where it parts from ``evaluated + [last]``; the first position the
        draft must still be fed (always <= the position of ``last``)."""
        slot = self._slots[request.seq_id]
        evaluated = request.evaluated
        n_sequence = len(evaluated) + 1
        common = min(len(slot.tokens) - slot.unverified, n_sequence - 1)
        limit = min(len(slot.tokens), n_sequence - 1)
        while common < limit and slot.tokens[common] == evaluated[common]:
            common += 1
        self._cut(request.seq_id, common)
        return common

    # --- drafting --------------------------------------------------------------------------

    def draft(self, requests: list[DraftRequest], eog: frozenset[int]) -> None:
        """Draft up to ``request.k`` tokens for each request into ``request.state.proposal``."""
        entries, fed = self._catch_up_all(requests)
        active = entries
        while self._batch.n_tokens:
            if not self._decode(fed, entries):
                break
            active = self._extend(active, eog)
            fed = [entry.request.seq_id for entry in active]
        for entry in entries:
            if entry.tokens:
                q = tuple(entry.q) if entry.request.state.rng is not None else None
                entry.request.state.proposal = Proposal(tuple(entry.tokens), q)

    def _catch_up_all(self, requests: list[DraftRequest]) -> tuple[list[_Drafting], list[int]]:
        """Feed each sequence what its draft cache lacks; those that are level will draft.

        Returns the drafting entries and every sequence id this first batch feeds."""
        batch = self._batch
        batch.clear()
        budget = self._catch_up
        entries: list[_Drafting] = []
        fed: list[int] = []
        for request in requests:
            start = self._level(request)
            missing = [*request.evaluated[start:], request.last]
            slot = self._slots[request.seq_id]
            if len(missing) > budget:  # a backlog: feed a chunk, draft in a later step
                if budget > 0:
                    batch.add_run(missing[:budget], start, request.seq_id)
                    slot.tokens.extend(missing[:budget])
                    fed.append(request.seq_id)
                budget = 0
                continue
            entry = _Drafting(request, slot)
            entry.row = batch.add_run(missing, start, request.seq_id, output_last=True)
            slot.tokens.extend(missing)
            fed.append(request.seq_id)
            budget -= len(missing)
            entries.append(entry)
        return entries, fed

    def _decode(self, fed: list[int], entries: list[_Drafting]) -> bool:
        status = self.context.decode(self._batch)
        if status != 0:  # forget what this decode may have half-written, draft nothing
            for seq_id in fed:
                self._cut(seq_id, 0)
            for entry in entries:
                entry.tokens.clear()
            return False
        return True

    def _extend(self, active: list[_Drafting], eog: frozenset[int]) -> list[_Drafting]:
        """Pick each sequence's next draft token; queue it for the next depth if it drafts on."""
        batch = self._batch
        batch.clear()
        following = []
        for entry in active:
            if entry.done:
                continue
            token = self._pick(entry)
            if token is None:
                entry.done = True
                continue
            entry.tokens.append(token)
            if len(entry.tokens) >= entry.request.k or token in eog:
                entry.done = True
                continue
            position = len(entry.slot.tokens)
            entry.row = batch.add(token, position, entry.request.seq_id, output=True)
            entry.slot.tokens.append(token)
            entry.slot.unverified += 1
            following.append(entry)
        return following

    def _pick(self, entry: _Drafting) -> int | None:
        """The draft's next token (None: stop drafting this sequence)."""
        logits = self.context.logits_row(entry.row)
        rng = entry.request.state.rng
        if rng is None:
            token = int(np.argmax(logits))
            if self._p_min > 0 and _top_probability(logits) < self._p_min:
                return None
        else:
            ids, probs = _draft_distribution(logits, entry.request.sampling.temperature)
            token = int(rng.choice(ids, p=probs))
            entry.q.append((ids, probs))
        return token if token < self._n_vocab_target else None

    # --- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        self._batch.close()
        self.context.close()
        self.model.close()


def _top_probability(logits: np.ndarray) -> float:
    shifted = logits.astype(np.float64) - float(logits.max())
    return float(1.0 / np.exp(shifted).sum())


def _draft_distribution(logits: np.ndarray, temperature: float) -> Distribution:
    """``q``: the draft's tempered softmax over its top candidates."""
    top = min(SAMPLED_DRAFT_TOP_K, logits.shape[0])
    ids = np.argpartition(logits, -top)[-top:]
    scaled = logits[ids].astype(np.float64) / max(temperature, 1e-6)
    weights = np.exp(scaled - scaled.max())
    return ids.astype(np.int64), weights / weights.sum()
