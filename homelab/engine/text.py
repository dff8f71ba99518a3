"""Turning a token stream into text a client may see.

llama.cpp hands out token *bytes*; one character may be split across tokens and a stop
string may be split across many. Two small state machines sit between the sampler and
the client:

- :class:`Utf8Decoder` releases only complete UTF-8 characters (holding at most 3 bytes)
  and turns truly invalid bytes into U+FFFD instead of waiting forever.
- :class:`StopMatcher` releases only text that cannot be the start of a stop string, and
  says when one was hit (the stop and everything after it are never released).

Both are pure and cheap: each ``feed`` costs O(len(new input) + longest stop).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

REPLACEMENT_CHARACTER = "\ufffd"


class Utf8Decoder:
    """Incremental UTF-8 decoding that never stalls.

    ``feed`` returns every complete character seen so far; an incomplete multi-byte tail
    (at most 3 bytes) is kept for the next call. A byte that can never start or continue a
    valid character becomes U+FFFD at once, so a model emitting garbage still streams.
    """

    def __init__(self) -> None:
        # The stdlib incremental decoder keeps only a *possibly valid* prefix pending and
        # replaces a byte as soon as it proves invalid: exactly the semantics we want.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # no bytes are pending: a token whose bytes are whole UTF-8 is its own text (read
        # by the scheduler for every token, so a plain attribute)
        self.idle = True

    def feed(self, data: bytes, whole: str | None = None) -> str:
        """The characters ``data`` completes. ``whole``: ``data`` decoded, when it is
        complete UTF-8 by itself (a cache of the caller's): returned as it is when no
        earlier bytes are pending, without decoding anything."""
        if whole is not None and self.idle:
            return whole
        text = self._decoder.decode(data, final=False)
        self.idle = not self._decoder.buffer
        return text

    def flush(self) -> str:
        """End of stream: a pending incomplete character becomes U+FFFD."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        self.idle = True
        return text

    @property
    def pending_bytes(self) -> int:
        """How many bytes are held back waiting for the rest of a character."""
        pending, _ = self._decoder.getstate()
        return len(pending)


class StopMatcher:
    """Finds stop strings across arbitrary chunk boundaries.

    ``feed(text)`` returns ``(safe_text, stopped)``. ``safe_text`` never contains a stop
    string, nor a suffix that might grow into one (that part is held back). Once
    ``stopped`` is True the matcher stays stopped and releases nothing more. Empty stop
    strings are ignored.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(sorted({stop for stop in stops if stop}, key=len))
        self._longest = max((len(stop) for stop in self._stops), default=0)
        self._proper_prefixes = frozenset(
            stop[:length] for stop in self._stops for length in range(1, len(stop))
        )
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, text: str) -> tuple[str, bool]:
        if self._stopped:
            return "", True
        if not self._stops:
            return text, False
        window = self._held + text
        stop_at = self._earliest_stop(window)
        if stop_at is not None:
            self._held = ""
            self._stopped = True
            return window[:stop_at], True
        keep = self._longest_possible_start(window)
        self._held = window[len(window) - keep :]
        return window[: len(window) - keep], False

    def flush(self) -> str:
        """Generation ended without a stop: release what was held back."""
        held, self._held = self._held, ""
        return "" if self._stopped else held

    def _earliest_stop(self, window: str) -> int | None:
        # ``_held`` is shorter than the longest stop, so every match that could start in
        # already-released text was found earlier: searching the window is enough.
        found = [index for stop in self._stops if (index := window.find(stop)) >= 0]
        return min(found) if found else None

    def _longest_possible_start(self, window: str) -> int:
        """Length of the longest suffix of ``window`` that is a proper prefix of a stop."""
        for length in range(min(len(window), self._longest - 1), 0, -1):
            if window[-length:] in self._proper_prefixes:
                return length
        return 0
