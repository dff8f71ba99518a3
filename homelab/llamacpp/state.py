"""One sequence's state (its K/V cells, or its recurrent state) to bytes and back.

``llama_state_seq_get_data`` copies every cell a sequence holds, with its positions, out of
the context's memory; ``llama_state_seq_set_data`` puts them into any sequence of a context
with the same layout (layer count, V transposition, cache streams, enough cells; llama.cpp
checks these and refuses, returning 0, never which model wrote the bytes — the caller keys
states by model). The ``partial`` variants (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``) copy only
the sliding-window cache of an SWA model, or only the recurrent part of a hybrid.

Call these on the compute lane, between decodes: they read and write the context's buffers.
"""

from __future__ import annotations

import ctypes
from typing import Any

from homelab.errors import EngineError
from homelab.llamacpp._lib import lib

PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the SWA / recurrent part alone


class SequenceStateError(EngineError):
    """llama.cpp could not copy a sequence's state out of, or into, a context."""

    title = "Prompt cache state problem"


def _flags(partial: bool) -> int:
    return PARTIAL_ONLY if partial else 0


def state_size_bytes(context_pointer: Any, seq_id: int, *, partial: bool = False) -> int:
    """Bytes :func:`save_sequence` will return for ``seq_id`` (0 when llama.cpp fails)."""
    return int(lib().llama_state_seq_get_size_ext(context_pointer, seq_id, _flags(partial)))


def save_sequence(context_pointer: Any, seq_id: int, *, partial: bool = False) -> bytearray:
    """The state of ``seq_id`` as bytes (a copy in host memory)."""
    size_bytes = state_size_bytes(context_pointer, seq_id, partial=partial)
    if size_bytes <= 0:
        raise SequenceStateError(
            f"llama.cpp could not size the state of sequence {seq_id}",
            hint="The prompt cache skips this slot; prefilling works as before.",
        )
    buffer = bytearray(size_bytes)
    view = (ctypes.c_uint8 * size_bytes).from_buffer(buffer)
    written = int(
        lib().llama_state_seq_get_data_ext(
            context_pointer, view, size_bytes, seq_id, _flags(partial)
        )
    )
    del view  # release the buffer export before anyone resizes or returns it
    if written != size_bytes:
        raise SequenceStateError(
            f"llama.cpp wrote {written} of {size_bytes} state bytes for sequence {seq_id}",
            hint="The prompt cache skips this slot; prefilling works as before.",
        )
    return buffer


StateBytes = bytes | bytearray | memoryview


def restore_sequence(
    context_pointer: Any, seq_id: int, data: StateBytes, *, partial: bool = False
) -> int:
    """Replace what ``seq_id`` holds with ``data`` (from :func:`save_sequence`); the bytes read.
    A writable buffer (bytearray, or a view of one) is read in place, anything else copied.

    On failure llama.cpp has cleared the sequence; :class:`SequenceStateError` says so."""
    size_bytes = len(data)
    try:
        source = (ctypes.c_uint8 * size_bytes).from_buffer(data)
    except TypeError:  # read-only (bytes)
        source = (ctypes.c_uint8 * size_bytes).from_buffer_copy(data)
    read = int(
        lib().llama_state_seq_set_data_ext(
            context_pointer, source, size_bytes, seq_id, _flags(partial)
        )
    )
    if read <= 0:
        raise SequenceStateError(
            f"llama.cpp refused a saved state of {size_bytes} bytes for sequence {seq_id} "
            "(another cache layout: layer count, streams, or too few cells)",
            hint="The state was dropped and the prompt is prefilled instead.",
        )
    return read
