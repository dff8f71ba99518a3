"""Prompt lookup (speculation kind ``ngram``): drafts copied from the sequence's own past.

The longest recent n-gram (``ngram_max`` down to ``ngram_min`` tokens) that occurred before in
the prompt or the text so far proposes the tokens that followed it. Free to compute; strong on
text that repeats (code edits, quoting, summaries, loops).
"""

from __future__ import annotations

from collections.abc import Sequence


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
