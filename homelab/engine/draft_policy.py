"""How many tokens each sequence drafts: the expected gain against the measured cost.

**Acceptance.** Per sequence, decayed counts of kept and first-rejected draft tokens give
``α``, the chance that a drafted token is kept given the ones before it were (a geometric
model: the i-th token of a draft is emitted with probability ``α^i``). A sequence's estimate
is blended with the engine's, and drifts back to it while the sequence does not draft.

**Cost.** :class:`StepCost` holds a decode's seconds by its rows: one row on its own (llama.cpp
runs a single row as a matrix-vector product; on a CPU a two-row batch of Q8_0 weights
measured 2.3x the time of one row here, while F16 cost +30 %), and a linear fit over
batches of two rows or more. Until a batch has been seen the fit is optimistic (each extra
row costs :data:`PRIOR_ROW_SHARE` of a one-row step), so the first steps speculate and
measure.

**Plan.** :meth:`DraftPolicy.plan` takes drafted tokens in order of their gain ``α_j^i``
across all sequences; with the best ``n`` of them a step yields ``B + Σ gains`` tokens in
``T(B + n) + D`` seconds (``B`` sequences, ``D`` the draft model's steps), and the ``n`` with
the best rate wins — ``0``, plain decoding, when speculation loses. Every
:data:`PROBE_INTERVAL` plain steps one plan assumes a high acceptance, so a draft that became
good again is noticed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

PRIOR_ACCEPTANCE = 0.6  # before anything is measured
PRIOR_WEIGHT = 2.0  # pseudo-observations behind a prior
SEQUENCE_DECAY = 0.8  # per verification: recent drafts count most
ENGINE_DECAY = 0.98
IDLE_FADE = 0.9  # per plain step of a sequence that chose not to draft
ENGINE_IDLE_FADE = 0.995
PRIOR_ROW_SHARE = 0.1  # an extra batch row's cost relative to a one-row step, until measured
PRIOR_DRAFT_SHARE = 0.3  # a draft step's cost relative to a target step, until measured
PROBE_INTERVAL = 64  # plain steps between optimistic plans
PROBE_ACCEPTANCE = 0.9


@dataclass
class Acceptance:
    """Decayed counts of kept and first-rejected draft tokens."""

    kept: float = 0.0
    rejected: float = 0.0

    def observe(self, drafted: int, accepted: int, decay: float) -> None:
        self.kept = self.kept * decay + accepted
        self.rejected = self.rejected * decay + (1.0 if accepted < drafted else 0.0)

    def fade(self, decay: float) -> None:
        self.kept *= decay
        self.rejected *= decay

    def rate(self, prior: float, weight: float) -> float:
        return (self.kept + weight * prior) / (self.kept + self.rejected + weight)


class LinearCost:
    """Seconds as ``a + b·rows``, fitted with exponential forgetting.

    When the row counts seen barely vary the slope cannot be told from the intercept; it is
    then taken as ``prior_per_row`` of a one-row step.
    """

    def __init__(self, prior_per_row: float, decay: float = 0.97) -> None:
        self.prior_per_row = prior_per_row
        self.decay = decay
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        d = self.decay
        self._w = self._w * d + 1.0
        self._x = self._x * d + rows
        self._y = self._y * d + seconds
        self._xx = self._xx * d + rows * rows
        self._xy = self._xy * d + rows * seconds

    @property
    def measured(self) -> bool:
        return self._w > 0

    def fit(self) -> tuple[float, float]:
        """(seconds per step, seconds per row); call only when :attr:`measured`."""
        w = self._w
        mean_rows, mean_s = self._x / w, self._y / w
        variance = self._xx / w - mean_rows * mean_rows
        if variance > 0.25:
            slope = (self._xy / w - mean_rows * mean_s) / variance
            slope = min(max(slope, 0.0), mean_s / mean_rows)
        else:
            beta = self.prior_per_row
            slope = beta * mean_s / (1.0 + beta * mean_rows)
        return max(mean_s - slope * mean_rows, 0.0), slope

    def seconds(self, rows: int) -> float:
        base, per_row = self.fit()
        return base + per_row * rows


class StepCost:
    """A decode's seconds by its row count: one row apart, batches on a line."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self._one_w = self._one_s = 0.0
        self.batch = LinearCost(PRIOR_ROW_SHARE)

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= 1:
            self._one_w = self._one_w * self.decay + 1.0
            self._one_s = self._one_s * self.decay + seconds
        else:
            self.batch.observe(rows, seconds)

    @property
    def measured(self) -> bool:
        return self._one_w > 0 or self.batch.measured

    def seconds(self, rows: int) -> float:
        """Measured, or extrapolated; 1.0 stands for a one-row step before anything is."""
        one = self._one_s / self._one_w if self._one_w else None
        if rows <= 1:
            return (
                one if one is not None else (self.batch.seconds(1) if self.batch.measured else 1.0)
            )
        if self.batch.measured:
            return self.batch.seconds(rows)
        return (one if one is not None else 1.0) * (1.0 + PRIOR_ROW_SHARE * (rows - 1))


class DraftPolicy:
    """Draft lengths per step from acceptance estimates and measured step costs."""

    def __init__(self, max_draft_tokens: int, *, adaptive: bool, uses_draft_model: bool) -> None:
        self.max_draft_tokens = max_draft_tokens
        self.adaptive = adaptive
        self.uses_draft_model = uses_draft_model
        self.target = StepCost()
        self.draft = StepCost()
        self.engine = Acceptance()
        self._plain_steps = 0

    def acceptance(self, sequence: Acceptance) -> float:
        prior = self.engine.rate(PRIOR_ACCEPTANCE, PRIOR_WEIGHT)
        return sequence.rate(prior, PRIOR_WEIGHT)

    def plan(self, sequences: list[tuple[Acceptance, int]], room: int) -> list[int]:
        """Draft lengths for ``(acceptance, most tokens it may draft)`` per generating
        sequence, at most ``room`` drafted tokens in all."""
        limits = [max(0, min(limit, self.max_draft_tokens)) for _, limit in sequences]
        if not self.adaptive:
            return _within(limits, room)
        alphas = [self.acceptance(acceptance) for acceptance, _ in sequences]
        if self._plain_steps >= PROBE_INTERVAL:
            alphas = [max(alpha, PROBE_ACCEPTANCE) for alpha in alphas]
        lengths = self._best_lengths(alphas, limits, room)
        self._plain_steps = 0 if any(lengths) else self._plain_steps + 1
        return lengths

    def _best_lengths(self, alphas: list[float], limits: list[int], room: int) -> list[int]:
        n_sequences = len(alphas)
        tokens = float(n_sequences)
        best_rate, best_n = tokens / self.target.seconds(n_sequences), 0
        lengths = [0] * n_sequences
        order: list[int] = []  # which sequence each successive drafted token goes to
        depth_rows: list[int] = []  # draft-model rows at each draft depth
        draft_s = 0.0
        gains = [(-alpha, j) for j, alpha in enumerate(alphas) if limits[j] > 0 and alpha > 0]
        heapq.heapify(gains)
        while gains and len(order) < room:
            negative_gain, j = heapq.heappop(gains)
            tokens -= negative_gain
            lengths[j] += 1
            order.append(j)
            if self.uses_draft_model:
                draft_s += self._extra_draft_seconds(depth_rows, lengths[j] - 1)
            rate = tokens / (self.target.seconds(n_sequences + len(order)) + draft_s)
            if rate > best_rate:
                best_rate, best_n = rate, len(order)
            if lengths[j] < limits[j]:
                heapq.heappush(gains, (negative_gain * alphas[j], j))
        chosen = [0] * n_sequences
        for j in order[:best_n]:
            chosen[j] += 1
        return chosen

    def _extra_draft_seconds(self, depth_rows: list[int], depth: int) -> float:
        """What one more sequence at draft depth ``depth`` adds to the draft model's time."""
        if len(depth_rows) <= depth:
            depth_rows.append(0)
        before = self._draft_seconds(depth_rows[depth]) if depth_rows[depth] else 0.0
        depth_rows[depth] += 1
        return self._draft_seconds(depth_rows[depth]) - before

    def _draft_seconds(self, rows: int) -> float:
        if self.draft.measured:
            return self.draft.seconds(rows)
        return PRIOR_DRAFT_SHARE * self.target.seconds(rows)

    def settle(self, sequence: Acceptance, drafted: int, accepted: int) -> None:
        sequence.observe(drafted, accepted, SEQUENCE_DECAY)
        self.engine.observe(drafted, accepted, ENGINE_DECAY)

    def idle(self, sequence: Acceptance) -> None:
        """The sequence decoded plainly: let its estimate drift back to the engine's."""
        sequence.fade(IDLE_FADE)

    def idle_engine(self) -> None:
        self.engine.fade(ENGINE_IDLE_FADE)


def _within(lengths: list[int], room: int) -> list[int]:
    """Shorten the longest drafts until they fit in ``room`` tokens."""
    lengths = list(lengths)
    excess = sum(lengths) - max(room, 0)
    while excess > 0:
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        lengths[longest] -= 1
        excess -= 1
    return lengths
