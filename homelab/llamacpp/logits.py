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
