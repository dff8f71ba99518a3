"""A context's memory (K/V cache or recurrent state), one sequence id at a time.

Positions are per sequence. Ranges are half-open, ``[start, end)``, with ``end = -1`` meaning
"to the end", as in llama.cpp. A recurrent memory cannot drop a suffix of its state:
:meth:`SequenceMemory.drop_from` then returns False and the caller clears the sequence.
"""

from __future__ import annotations

from typing import Any

from homelab.errors import EngineError
from homelab.llamacpp._lib import lib

TO_THE_END = -1


class SequenceMemory:
    """The memory of one context (valid while the context is)."""

    def __init__(self, pointer: Any, *, one_stream: bool) -> None:
        self._lib = lib()
        self._pointer = pointer
        self._one_stream = one_stream  # unified cache, or a single sequence

    @property
    def one_stream(self) -> bool:
        """One cache stream for every sequence (else one each: llama.cpp's kv_unified off)."""
        return self._one_stream

    def clear(self) -> None:
        """Forget every sequence, cache contents included."""
        self._lib.llama_memory_clear(self._pointer, True)

    def clear_sequence(self, seq_id: int) -> None:
        self._lib.llama_memory_seq_rm(self._pointer, seq_id, -1, TO_THE_END)

    def drop_from(self, seq_id: int, position: int) -> bool:
        """Forget positions >= ``position``; False when this memory cannot (recurrent)."""
        return bool(self._lib.llama_memory_seq_rm(self._pointer, seq_id, position, TO_THE_END))

    def copy_sequence(
        self, source_seq_id: int, target_seq_id: int, start: int = 0, end: int = TO_THE_END
    ) -> None:
        """Let ``target_seq_id`` share ``source_seq_id``'s cells in ``[start, end)``.

        Without a unified cache each sequence has its own stream, and llama.cpp copies only
        whole sequences between streams (it aborts the process on a part).
        """
        if not self._one_stream and (start > 0 or end != TO_THE_END):
            raise EngineError(
                "only whole sequences can be copied in a cache that is not unified",
                hint="Copy the whole sequence, or create the context with kv_unified.",
            )
        self._lib.llama_memory_seq_cp(self._pointer, source_seq_id, target_seq_id, start, end)

    def first_position(self, seq_id: int) -> int:
        """Smallest position held (above 0 once a sliding window moved on); -1 when empty."""
        return int(self._lib.llama_memory_seq_pos_min(self._pointer, seq_id))

    def last_position(self, seq_id: int) -> int:
        """Largest position held; -1 when empty."""
        return int(self._lib.llama_memory_seq_pos_max(self._pointer, seq_id))
