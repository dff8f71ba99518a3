"""Verifying a draft against the target's sampler: which drafted tokens a sequence keeps.

The target decodes ``[last, d0 … dk-1]`` with logits at every row; row ``i`` predicts the
token after ``d(i-1)``. Both rules below leave the emitted tokens distributed exactly as the
target alone would produce them:

- **point-mass drafts** (prompt lookup always; a draft model at temperature 0): the draft's
  distribution ``q`` is a point mass, so the standard rule "accept with probability
  ``min(1, p/q)``, else sample from ``max(0, p - q)``" becomes: sample the target's own
  chain at row ``i`` and accept while the sample equals ``d_i``. The chain (and its random
  stream) is used exactly once per emitted token, as without speculation, so greedy and even
  seeded sampling give the same tokens as plain decoding.
- **sampled drafts** (a draft model at temperature > 0): ``q`` is the draft's distribution
  the token was drawn from and ``p`` the target chain's shaped distribution
  (:func:`~homelab.llamacpp.candidates.shaped_distribution`); :func:`accept_or_resample`
  applies the rule with the sequence's own random generator.

After the last accepted draft token the target's row gives one more token for free (the
"bonus"). Sampling stops at an end-of-generation token: a grammar must never see a token
after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from homelab.engine.sampling import SamplerChain
from homelab.llamacpp.context import Context

Distribution = tuple[np.ndarray, np.ndarray]  # (token ids, probabilities)


@dataclass(frozen=True)
class Proposal:
    """One sequence's draft for this step."""

    tokens: tuple[int, ...]
    q: tuple[Distribution, ...] | None = None  # per token, when drawn from a distribution


@dataclass(frozen=True)
class Verdict:
    tokens: tuple[int, ...]  # what the target emits this step, in order (at least one)
    accepted: int  # how many of the drafted tokens the target kept


def verify(
    chain: SamplerChain,
    context: Context,
    rows: Sequence[int],
    proposal: Proposal,
    ends: Callable[[int], bool],
    rng: np.random.Generator | None = None,
) -> Verdict:
    """The tokens the target emits for ``proposal``; ``rows`` are the batch rows of
    ``[last, d0 …]``; ``ends(token)`` says a token ends the generation."""
    if proposal.q is None:
        return _verify_point_mass(chain, context, rows, proposal.tokens, ends)
    assert rng is not None
    return _verify_sampled(chain, context, rows, proposal, ends, rng)


def _verify_point_mass(
    chain: SamplerChain,
    context: Context,
    rows: Sequence[int],
    draft: Sequence[int],
    ends: Callable[[int], bool],
) -> Verdict:
    emitted: list[int] = []
    for index, row in enumerate(rows):
        token = chain.sample(context, row)
        emitted.append(token)
        if index == len(draft) or token != draft[index] or ends(token):
            break
    accepted = sum(1 for i, token in enumerate(emitted[: len(draft)]) if token == draft[i])
    return Verdict(tuple(emitted), accepted)


def _verify_sampled(
    chain: SamplerChain,
    context: Context,
    rows: Sequence[int],
    proposal: Proposal,
    ends: Callable[[int], bool],
    rng: np.random.Generator,
) -> Verdict:
    assert proposal.q is not None
    emitted: list[int] = []
    for index, drafted in enumerate(proposal.tokens):
        p_ids, p_probs = chain.distribution(context, rows[index])
        q_ids, q_probs = proposal.q[index]
        token, kept = accept_or_resample(p_ids, p_probs, q_ids, q_probs, drafted, rng)
        chain.accept(token)
        emitted.append(token)
        if not kept or ends(token):
            return Verdict(tuple(emitted), index + int(kept))
    emitted.append(chain.sample(context, rows[len(proposal.tokens)]))  # the bonus token
    return Verdict(tuple(emitted), len(proposal.tokens))


def accept_or_resample(
    p_ids: np.ndarray,
    p_probs: np.ndarray,
    q_ids: np.ndarray,
    q_probs: np.ndarray,
    drafted: int,
    rng: np.random.Generator,
) -> tuple[int, bool]:
    """Speculative sampling's rule for one drafted token: (token, whether it was the draft's).

    Keep ``drafted`` with probability ``min(1, p/q)``; otherwise draw from the residual
    ``max(0, p - q)`` (normalised). The result is distributed exactly as ``p``.
    """
    p = _probability(p_ids, p_probs, drafted)
    q = _probability(q_ids, q_probs, drafted)
    if q > 0 and rng.random() * q < p:
        return drafted, True
    ids = np.union1d(p_ids, q_ids)
    residual = np.zeros(len(ids))
    residual[np.searchsorted(ids, p_ids)] += p_probs
    if q > 0:
        residual[np.searchsorted(ids, q_ids)] -= q_probs
    np.maximum(residual, 0.0, out=residual)
    total = residual.sum()
    if total <= 0:  # p == q: nothing is left over, the draft's rejection was p's own draw
        return int(rng.choice(p_ids, p=p_probs / p_probs.sum())), False
    return int(rng.choice(ids, p=residual / total)), False


def _probability(ids: np.ndarray, probs: np.ndarray, token: int) -> float:
    where = np.nonzero(ids == token)[0]
    return float(probs[where[0]]) if len(where) else 0.0
