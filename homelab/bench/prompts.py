"""Benchmark prompts: windows of the bundled sample text, each one different from the others.

Every request of a benchmark gets its own window (a new starting offset in the text) and its
own tenant, so no request can reuse another's prefix cache: prefill figures measure
evaluating the prompt, not looking it up. Prompts are token ids, so their length is exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from homelab.bench.quality import BUNDLED_TEXT
from homelab.errors import BenchError

OFFSET_STRIDE = 97  # tokens between the starts of consecutive windows (prime: few repeats)


class PromptSource:
    """Hands out token windows of a text with distinct starts, and fresh tenant names."""

    def __init__(self, tokens: Sequence[int], tenant_prefix: str = "bench") -> None:
        if not tokens:
            raise BenchError("the benchmark text produced no tokens")
        self._tokens = list(tokens)
        self._offsets = itertools.count(0, OFFSET_STRIDE)
        self._serial = itertools.count(1)
        self._tenant_prefix = tenant_prefix

    @classmethod
    def from_tokenizer(cls, tokenize: Callable[[str], list[int]]) -> PromptSource:
        """``tokenize`` is e.g. ``lambda text: engine.tokenize(text, add_bos=False)``."""
        return cls(tokenize(BUNDLED_TEXT.read_text(encoding="utf-8")))

    def prompt(self, n_tokens: int) -> tuple[int, ...]:
        """The next window of ``n_tokens`` tokens (the text wraps around when it is short)."""
        start = next(self._offsets) % len(self._tokens)
        cycled = itertools.islice(itertools.cycle(self._tokens), start, start + n_tokens)
        return tuple(cycled)

    def tenant(self) -> str:
        return f"{self._tenant_prefix}-{next(self._serial)}"
