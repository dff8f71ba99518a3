"""How many tokens each sequence drafts: the expected gain against the measured cost.

**Acceptance.** Per sequence, decayed counts of kept and first-rejected draft tokens give
``α``, the chance that a drafted token is kept given the ones before it were (a geometric
model: the i-th token of a draft is emitted with probability ``α^i``). A sequence's estimate
is blended with the engine's, and drifts back to it while the sequence does not draft.

**Cost.** :class:`StepCost` holds a decode's seconds by its rows: for each row count the
lower quartile of its last few measurements (other work on the machine and the first
decodes of a context only ever add time, in spikes a mean would keep for long),
interpolated between the row counts seen. One row is not on the line through the others:
llama.cpp runs it as a
matrix-vector product, and on a CPU a two-row batch of Q8_0 weights measured 2.3x the time of
one row here, while F16 cost +30 %. Until batches have been measured :data:`TRUSTED` times
(the first decodes of a shape, and the draft model's first touch of its weights, are slow),
each extra row is assumed to cost :data:`PRIOR_ROW_SHARE` of a one-row step, so the first
steps speculate and measure.

**Plan.** :meth:`DraftPolicy.plan` takes drafted tokens in order of their gain ``α_j^i``
across all sequences; with the best ``n`` of them a step yields ``B + Σ gains`` tokens in
``T(B + n) + D`` seconds (``B`` sequences, ``D`` the draft model's steps), and the ``n`` with
the best rate wins — ``0``, plain decoding, when speculation loses. After
:data:`PROBE_INTERVAL` plain steps one plan assumes a high acceptance, so a draft that
became good again is noticed (the costs are measured, and stay true).

**Verdict.** The plan trusts a model of the step; what it leaves out (drafting and lookup
overhead in Python, sampling every verified row, acceptance below the geometric model) can
make speculation lose while the model says it wins. So :class:`StepVerdict` measures whole
engine steps — from the proposal to the end of the target's decode, seconds per emitted
token over the recent steps of each kind (their seconds summed over their tokens summed: a
median of per-step ratios would let the steps whose drafts were all rejected, one token each,
outvote the ones that kept four) — separately for steps that speculated and steps that did
not, per number of generating sequences (a few plain steps are taken once to compare with,
if the plan never chose one). When speculating steps are measurably slower (by
:data:`VERDICT_MARGIN`), speculation is off for that many sequences for
:data:`BACKOFF_STEPS` steps, doubling (up to :data:`MAX_BACKOFF_STEPS`) each time a probe
after the pause loses again, and back to the start when one wins; the optimistic plans
wait as long once speculation lost at that batch size.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque
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
RECENT = 7  # measurements kept per row count
TRUSTED = 3  # batch measurements before batch times are believed (the first are slow)
VERDICT_SAMPLES = 6  # whole steps of each kind measured before a verdict
VERDICT_RECENT = 16  # whole-step measurements kept per kind and batch size
VERDICT_MARGIN = 0.02  # speculating steps must be this much faster per token to stay on
BACKOFF_STEPS = 128  # plain steps after speculation was measured to lose
MAX_BACKOFF_STEPS = 4096


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


class StepCost:
    """A decode's seconds by its row count, from the lower quartile of recent measurements."""

    def __init__(self) -> None:
        self._recent: dict[int, deque[float]] = {}
        self._typical: dict[int, float] = {}
        self._rows: list[int] = []  # row counts >= 2 measured twice or more, sorted
        self._batches = 0  # batch (>= 2 rows) measurements so far

    def observe(self, rows: int, seconds: float) -> None:
        rows = max(rows, 1)
        recent = self._recent.setdefault(rows, deque(maxlen=RECENT))
        recent.append(seconds)
        self._typical[rows] = sorted(recent)[len(recent) // 4]
        if rows > 1:
            self._batches += 1
            if len(recent) == 2:  # two at least, so one spike is not the estimate
                self._rows.insert(bisect_left(self._rows, rows), rows)

    @property
    def measured(self) -> bool:
        return 1 in self._typical or self._trusted

    @property
    def _trusted(self) -> bool:
        return bool(self._rows) and self._batches >= TRUSTED

    def seconds(self, rows: int) -> float:
        """Measured or interpolated; 1.0 stands for a one-row step while nothing is measured."""
        one = self._typical.get(1)
        if rows <= 1 and one is not None:
            return one
        if not self._trusted:
            base = one if one is not None else self._from_batches(1)
            return base * (1.0 + PRIOR_ROW_SHARE * (rows - 1))
        return max(self._from_batches(rows), one or 1e-9)  # a batch is never cheaper than a row

    def _from_batches(self, rows: int) -> float:
        known = self._rows
        if not known:
            return 1.0
        if len(known) == 1:  # one batch size seen: rows scale it by the prior share
            at = known[0]
            per_row = PRIOR_ROW_SHARE * self._typical[at] / (1.0 + PRIOR_ROW_SHARE * (at - 1))
            return max(self._typical[at] + per_row * (rows - at), per_row)
        index = min(max(bisect_left(known, rows), 1), len(known) - 1)
        low, high = known[index - 1], known[index]  # interpolate, or extend the end segments
        slope = max((self._typical[high] - self._typical[low]) / (high - low), 0.0)
        return max(self._typical[low] + slope * (rows - low), 0.0)


@dataclass
class _Verdict:
    """Whole steps at one batch size, by kind of step: (seconds, tokens emitted) each."""

    plain: deque[tuple[float, int]]
    speculating: deque[tuple[float, int]]
    paused: int = 0  # plain steps still to go before speculation may be tried again
    backoff: int = BACKOFF_STEPS  # the next pause, if the next probe loses too


class StepVerdict:
    """Whether speculating steps, measured whole, beat plain ones (per batch size)."""

    def __init__(self) -> None:
        self._by_sequences: dict[int, _Verdict] = {}

    def _at(self, n_sequences: int) -> _Verdict:
        if n_sequences not in self._by_sequences:
            self._by_sequences[n_sequences] = _Verdict(
                deque(maxlen=VERDICT_RECENT), deque(maxlen=VERDICT_RECENT)
            )
        return self._by_sequences[n_sequences]

    def paused(self, n_sequences: int) -> bool:
        """Whether this step must be plain at this batch size: speculation was measured to
        lose (counts the pause down), or plain steps are needed to compare with."""
        verdict = self._at(n_sequences)
        if len(verdict.speculating) >= VERDICT_SAMPLES and len(verdict.plain) < VERDICT_SAMPLES:
            return True  # a control measurement: a few plain steps, once
        if verdict.paused <= 0:
            return False
        verdict.paused -= 1
        if verdict.paused == 0:
            verdict.speculating.clear()  # the probe is judged on fresh measurements
        return True

    def probe_interval(self, n_sequences: int) -> int:
        """Plain steps between optimistic plans: longer once speculation lost here."""
        verdict = self._at(n_sequences)
        return PROBE_INTERVAL if verdict.backoff <= BACKOFF_STEPS else verdict.backoff

    def observe(self, n_sequences: int, speculated: bool, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        verdict = self._at(n_sequences)
        (verdict.speculating if speculated else verdict.plain).append((seconds, tokens))
        if verdict.paused <= 0:
            self._judge(verdict)

    @staticmethod
    def _judge(verdict: _Verdict) -> None:
        if min(len(verdict.plain), len(verdict.speculating)) < VERDICT_SAMPLES:
            return
        plain, speculating = _per_token(verdict.plain), _per_token(verdict.speculating)
        if speculating * (1.0 + VERDICT_MARGIN) <= plain:
            verdict.backoff = BACKOFF_STEPS  # it wins: a later loss pauses briefly again
            return
        verdict.paused = verdict.backoff
        verdict.backoff = min(2 * verdict.backoff, MAX_BACKOFF_STEPS)


def _per_token(steps: deque[tuple[float, int]]) -> float:
    """Seconds per emitted token over ``steps``: all their time over all their tokens."""
    return sum(seconds for seconds, _ in steps) / sum(tokens for _, tokens in steps)


class DraftPolicy:
    """Draft lengths per step from acceptance estimates and measured step costs."""

    def __init__(self, max_draft_tokens: int, *, adaptive: bool, uses_draft_model: bool) -> None:
        self.max_draft_tokens = max_draft_tokens
        self.adaptive = adaptive
        self.uses_draft_model = uses_draft_model
        self.target = StepCost()
        self.draft = StepCost()
        self.engine = Acceptance()
        self.verdict = StepVerdict()
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
        if self.verdict.paused(len(sequences)):
            return [0] * len(sequences)
        alphas = [self.acceptance(acceptance) for acceptance, _ in sequences]
        probe = self._plain_steps >= self.verdict.probe_interval(len(sequences))
        if probe:
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
        rows = depth_rows[depth]
        before = self._draft_seconds(rows) if rows else 0.0
        depth_rows[depth] += 1
        return self._draft_seconds(rows + 1) - before

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
