"""The logits of the last ``llama_decode`` as numpy arrays, without copying.

The arrays are views of llama.cpp's output buffer: valid until the next decode on the same
context. Copy (or reduce) them before that.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from homelab.llamacpp._lib import lib


def logits_row(context_pointer: Any, row: int, n_vocab: int) -> np.ndarray:
    """The logits of one output row (``row`` as the batch numbered it; -1 is the last)."""
    pointer = lib().llama_get_logits_ith(context_pointer, row)
    floats = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(floats, (n_vocab,))


def all_logits(context_pointer: Any, n_rows: int, n_vocab: int) -> np.ndarray:
    """The logits of ``n_rows`` output rows, shape ``(n_rows, n_vocab)``."""
    return np.ctypeslib.as_array(lib().llama_get_logits(context_pointer), (n_rows, n_vocab))


_OUTPUT_VIEWS: dict[tuple[int, int, int], np.ndarray] = {}  # (address, rows, n_vocab) -> view


def output_logits(context_pointer: Any, n_rows: int, n_vocab: int) -> np.ndarray | None:
    """The logits of the last decode's ``n_rows`` outputs as one ``(n_rows, n_vocab)`` view
    (llama.h: the rows of the tokens marked as outputs are contiguous, in batch order), or
    None when there are none. The views are cached by buffer address: building one costs
    ~10 µs, more than the argmax a decode step makes over a small vocabulary."""
    pointer = lib().llama_get_logits(context_pointer)
    address = ctypes.cast(pointer, ctypes.c_void_p).value
    if not address:
        return None
    key = (address, n_rows, n_vocab)
    view = _OUTPUT_VIEWS.get(key)
    if view is None:
        if len(_OUTPUT_VIEWS) >= 256:  # buffers reallocated many times: start afresh
            _OUTPUT_VIEWS.clear()
        view = _OUTPUT_VIEWS[key] = np.ctypeslib.as_array(pointer, (n_rows, n_vocab))
    return view
