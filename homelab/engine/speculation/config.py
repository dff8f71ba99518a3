"""How an engine speculates: the plain data the rest of homelab imports.

A leaf of :mod:`homelab.engine.speculation`: it imports none of the machinery, so the command
line, the TUI, ``models`` and ``bench`` name a :class:`SpeculationConfig` without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from homelab.errors import EngineError

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
