"""Speculative decoding: each sequence drafts a few tokens, the target verifies them in bulk.

The modules, each importing only those below it (held by import-linter, ``pyproject.toml``)::

    speculator    Speculator: the scheduler's side — proposes drafts, learns from verdicts
    draft_model   DraftModel: a small model on its own llama.cpp context (kind "draft")
    sequence      SequenceSpeculation, DraftRequest: one sequence's state, shared by the above
    acceptance    verify: which drafted tokens the target's sampler keeps
    policy        DraftPolicy: how many tokens to draft, measured whole steps at a time
    lookup        NgramDrafter: prompt lookup (kind "ngram")
    refusals      what cannot speculate (recurrent targets, trimmed windows, foreign vocabularies)
    config        SpeculationConfig, SpeculationError: plain data, a leaf

This package exports the configuration, what the rest of homelab names; the engine and the
step's side of it (``homelab.engine.drafting``, which sits over the job types and so outside
this package) import the machinery from its modules. Importing the configuration loads nothing
else of it.
"""

from homelab.engine.speculation.config import (
    KINDS,
    MAX_DRAFT_TOKENS,
    SpeculationConfig,
    SpeculationError,
    SpeculationKind,
)

__all__ = ["KINDS", "MAX_DRAFT_TOKENS", "SpeculationConfig", "SpeculationError", "SpeculationKind"]
