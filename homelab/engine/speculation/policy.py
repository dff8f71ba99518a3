"""How many tokens each sequence drafts: the draft length that measures fastest, here, now.

Whether speculation pays, and how long a draft should be, depends on things no model of the
step predicts well: how much more a decode of ``k + 1`` rows costs than one row (on a CPU a
two-row batch of Q8_0 weights measured 2.3x one row, F16 +30 %, on a GPU almost nothing),
what drafting costs (a draft model's steps, the lookup, Python), what verifying costs
(sampling every verified row), and the acceptance of *this* draft on *this* text at each
length. An earlier version planned from such a model (geometric acceptance, interpolated row
costs) and drafted ~2 tokens where 4 paid, and paused on noise. So the policy measures the
thing itself.

**Arms.** The candidate draft lengths are a ladder ``0, 1, 2, 3, 4, 6, 8, …`` up to
``max_draft_tokens`` (``0`` is plain decoding). For each number of generating sequences
(bucketed: 1, 2, 4, 8, …) the policy keeps, per length, its recent whole engine steps — from
the proposal to the last emitted token: drafting, decode, verification, sampling — and values
the length at their seconds over their tokens (the tokens of one step vary with luck, a sum
evens them out; a step's time counts at most :data:`SPIKE` times the median step, so one the
machine delayed moves little).

**Choice.** Every :data:`BLOCK_STEPS` steps the policy picks the best-valued length, except
that the ladder neighbours of the best are measured too: at once while they have no value (so
the policy climbs from plain decoding one rung at a time), then again after a wait that grows
each time the neighbour loses (up to :data:`MAX_WAIT_BLOCKS` blocks) and resets when it wins.
An explored length is measured on fresh steps: one block when it is clearly slower
(:data:`CLEAR_LOSS`; its wait then grows fourfold), :data:`MIN_BLOCKS` blocks before it may
win, up to :data:`MAX_EXPLORE_BLOCKS` while the two are within :data:`NARROW_LOSS`. So a
length that loses badly — speculation on a CPU where a second batch row is dear — costs one
block in ``MAX_WAIT_BLOCKS``, and a close one costs little. And exploring has a budget: a new
exploration starts only while the time explored steps took beyond what the best would have
taken for their tokens (at its value when each exploration began; an exploration that wins
pays back) is under :data:`EXPLORE_SHARE` of the bucket's measured time — where no draft
pays, measuring costs about that much, however noisy the machine. A draft length is played
only where it measures :data:`PLAIN_MARGIN` faster than plain decoding: a tie with plain
decoding costs wherever the measurements erred, plain decoding never does. Steps older than
:data:`MAX_AGE_STEPS` are forgotten, so the choice follows the text being generated.
Known limit: a climb one rung at a time does not cross a valley — where one drafted token
loses but three or eight would win, the policy stays plain (a draft that is nearly always
right on a CPU where rows are dear: for Q8_0 on the 2-core development machine a batch of
2 rows costs 1.9x one row, 4 rows 2.2x, 8 rows 2.9x).

**Sequences.** Within a step every sequence drafts the chosen length (fewer where its request
ends sooner, or where the batch is full), except a sequence whose own drafts are nearly all
rejected (its decayed acceptance below :data:`HOPELESS_ACCEPTANCE`): it decodes plainly, and
its estimate drifts back while it does. ``adaptive=False`` drafts ``max_draft_tokens`` always.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

BLOCK_STEPS = 4  # whole engine steps between two choices of length
KEPT_STEPS = 32  # recent steps per length behind its value
SPIKE = 3.0  # a step counts at most this many times its length's median step
MIN_BLOCKS = 3  # blocks of an explored length before it is compared with the best
CLEAR_LOSS = 0.5  # an explored length this much slower than the best loses after one block
NARROW_LOSS = 0.1  # within this, an explored length is measured up to MAX_EXPLORE_BLOCKS
MAX_EXPLORE_BLOCKS = 7
FIRST_WAIT_BLOCKS = 2  # blocks before a losing neighbour is measured again (doubling)
MAX_WAIT_BLOCKS = 128
MAX_AGE_STEPS = 2048  # steps of a length older than this (in the bucket's steps) are dropped
PLAIN_MARGIN = 0.03  # a draft length is played over plain decoding only if this much faster
EXPLORE_SHARE = 0.01  # of all measured time, the most that explorations' excess may take
LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
PRIOR_ACCEPTANCE = 0.5  # a sequence's estimate before it drafted
PRIOR_WEIGHT = 2.0  # pseudo-observations behind it
SEQUENCE_DECAY = 0.8  # per verification: recent drafts count most
IDLE_FADE = 0.9  # per step a sequence does not draft: back towards the prior
HOPELESS_ACCEPTANCE = 0.1  # below this a sequence stops drafting until its estimate recovers


@dataclass
class Acceptance:
    """One sequence's decayed counts of kept and first-rejected draft tokens."""

    kept: float = 0.0
    rejected: float = 0.0

    def observe(self, drafted: int, accepted: int) -> None:
        self.kept = self.kept * SEQUENCE_DECAY + accepted
        self.rejected = self.rejected * SEQUENCE_DECAY + (1.0 if accepted < drafted else 0.0)

    def fade(self) -> None:
        self.kept *= IDLE_FADE
        self.rejected *= IDLE_FADE

    @property
    def rate(self) -> float:
        """The chance a drafted token is kept given the ones before it were."""
        return (self.kept + PRIOR_WEIGHT * PRIOR_ACCEPTANCE) / (
            self.kept + self.rejected + PRIOR_WEIGHT
        )


@dataclass
class _Arm:
    """One draft length in one bucket: its recent steps (when, seconds, tokens emitted)."""

    steps: deque[tuple[int, float, int]] = field(default_factory=lambda: deque(maxlen=KEPT_STEPS))
    wait: int = 0  # blocks before it is explored again (as a neighbour of the best)
    next_wait: int = FIRST_WAIT_BLOCKS

    def value(self, now: int) -> float | None:
        """Seconds per token: all recent time over all recent tokens (the tokens of a step
        vary with luck, a sum evens them out), each step's time capped at :data:`SPIKE`
        times the median step (a step the machine delayed moves little)."""
        recent = [(s, t) for at, s, t in self.steps if now - at <= MAX_AGE_STEPS]
        if not recent:
            return None
        seconds = sorted(s for s, _ in recent)
        cap = SPIKE * seconds[len(seconds) // 2]
        tokens = sum(t for _, t in recent)
        return sum(min(s, cap) for s, _ in recent) / tokens if tokens else None

    def lost(self, growth: int) -> None:
        """Wait before the next try, then ``growth`` times as long after the next loss."""
        self.wait = self.next_wait
        self.next_wait = min(growth * self.next_wait, MAX_WAIT_BLOCKS)

    def won(self) -> None:
        self.wait, self.next_wait = 0, FIRST_WAIT_BLOCKS


class _Bucket:
    """The arms of one bucket of generating sequences, and the block being measured."""

    def __init__(self, lengths: tuple[int, ...]) -> None:
        self.lengths = lengths
        self.arms = [_Arm() for _ in lengths]
        self.playing = 0  # ladder index of the block in progress
        self.best = 0  # ladder index of the best-valued length
        self.exploring: int | None = None  # the neighbour being measured, block after block
        self.block_steps = 0  # steps of the block so far
        self.clock = 0  # steps measured in this bucket (the clock of the ages)
        self.total_s = 0.0  # all measured time of this bucket
        self.spent_s = 0.0  # explored steps' time beyond what the best would have taken
        self.best_s_per_token: float | None = None  # the best's value when exploring began

    def observe(self, tokens: int, seconds: float) -> None:
        self.clock += 1
        self.total_s += seconds
        if self.playing == self.exploring and self.best_s_per_token is not None:
            self.spent_s += seconds - self.best_s_per_token * tokens
        self.arms[self.playing].steps.append((self.clock, seconds, tokens))
        self.block_steps += 1
        if self.block_steps >= BLOCK_STEPS:
            self.block_steps = 0
            if self.playing == self.exploring:
                self._judge(self.exploring)
            self.playing = self._choose()

    def _judge(self, index: int) -> None:
        """After each block of an exploration: a clear loser stops at once, a close one is
        measured :data:`MIN_BLOCKS` times before it is compared."""
        arm, best = self.arms[index], self.arms[self.best].value(self.clock)
        value = arm.value(self.clock)
        if best is None or value is None:
            self.exploring = None
            return
        ratio = value * self._handicap(index) / (best * self._handicap(self.best))
        n_blocks = len(arm.steps) // BLOCK_STEPS
        if ratio > 1.0 + CLEAR_LOSS:
            arm.lost(growth=4)  # far more than it yields: seldom worth a look
        elif n_blocks < MIN_BLOCKS:
            return  # measure it again
        elif ratio < 1.0:
            arm.won()
        elif ratio <= 1.0 + NARROW_LOSS and n_blocks < MAX_EXPLORE_BLOCKS:
            return  # too close to call yet
        else:
            arm.lost(growth=2)
        self.exploring = None

    def _handicap(self, index: int) -> float:
        """Drafting must beat plain decoding by a margin: a draft that only ties costs
        where the measurements erred, plain decoding never does."""
        return 1.0 + PLAIN_MARGIN if self.lengths[index] else 1.0

    def _best_index(self) -> int:
        values = [(arm.value(self.clock), index) for index, arm in enumerate(self.arms)]
        measured = [(value * self._handicap(i), i) for value, i in values if value is not None]
        return min(measured)[1] if measured else 0

    def _choose(self) -> int:
        if self.exploring is not None:
            return self.exploring
        self.best = best = self._best_index()
        for arm in self.arms:
            arm.wait = max(arm.wait - 1, 0)
        if self.spent_s > EXPLORE_SHARE * self.total_s:
            return best
        for index in (best + 1, best - 1):
            if 0 <= index < len(self.arms) and self.arms[index].wait == 0:
                self.best_s_per_token = self.arms[best].value(self.clock)
                self.arms[index].steps.clear()  # judged on fresh measurements only
                self.exploring = index
                return index
        return best


def draft_lengths(max_draft_tokens: int) -> tuple[int, ...]:
    """The ladder of lengths a policy chooses from (``0``: plain decoding)."""
    lengths = tuple(k for k in LADDER if k < max_draft_tokens)
    return (*lengths, max_draft_tokens)


def bucket_of(n_sequences: int) -> int:
    """1, 2, 4, 8, …: the smallest power of two that holds ``n_sequences``."""
    return 1 << max(n_sequences - 1, 0).bit_length()


class DraftPolicy:
    """Draft lengths per step, chosen by measuring whole steps of each length."""

    def __init__(self, max_draft_tokens: int, *, adaptive: bool) -> None:
        self.max_draft_tokens = max_draft_tokens
        self.adaptive = adaptive
        self._lengths = draft_lengths(max_draft_tokens)
        self._buckets: dict[int, _Bucket] = {}

    def _bucket(self, n_sequences: int) -> _Bucket:
        key = bucket_of(n_sequences)
        if key not in self._buckets:
            self._buckets[key] = _Bucket(self._lengths)
        return self._buckets[key]

    def length_now(self, n_sequences: int) -> int:
        """The draft length the next step with ``n_sequences`` generating plays."""
        if not self.adaptive:
            return self.max_draft_tokens
        bucket = self._bucket(n_sequences)
        return bucket.lengths[bucket.playing]

    def plan(self, sequences: list[tuple[Acceptance, int]], room: int) -> list[int]:
        """Draft lengths for ``(acceptance, most tokens it may draft)`` per generating
        sequence, at most ``room`` drafted tokens in all."""
        k = self.length_now(len(sequences))
        lengths = []
        for acceptance, limit in sequences:
            hopeless = self.adaptive and acceptance.rate < HOPELESS_ACCEPTANCE
            lengths.append(0 if hopeless else max(0, min(limit, k)))
            if self.adaptive and lengths[-1] == 0 and limit > 0:
                acceptance.fade()
        return _within(lengths, room)

    def observe_step(self, n_sequences: int, tokens: int, seconds: float) -> None:
        """A whole decode-only step: the tokens it emitted and the seconds it took."""
        if self.adaptive and tokens > 0 and seconds > 0:
            self._bucket(n_sequences).observe(tokens, seconds)

    @staticmethod
    def settle(sequence: Acceptance, drafted: int, accepted: int) -> None:
        sequence.observe(drafted, accepted)


def _within(lengths: list[int], room: int) -> list[int]:
    """Shorten the longest drafts until they fit in ``room`` tokens."""
    lengths = list(lengths)
    excess = sum(lengths) - max(room, 0)
    while excess > 0:
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        lengths[longest] -= 1
        excess -= 1
    return lengths
