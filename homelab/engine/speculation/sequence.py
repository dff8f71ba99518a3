"""What the scheduler, the speculator and the draft model share about one sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from homelab.engine.api import SamplingParams
from homelab.engine.speculation.acceptance import Proposal
from homelab.engine.speculation.lookup import NgramDrafter
from homelab.engine.speculation.policy import Acceptance


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
