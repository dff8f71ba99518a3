"""The logits of the last ``llama_decode`` as numpy arrays, without copying.

The arrays are views of llama.cpp's output buffer: valid until the next decode on the same
context. Copy (or reduce) them before that.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from homelab.llamacpp._lib import lib, library_handle


def logits_row(context_pointer: Any, row: int, n_vocab: int) -> np.ndarray:
    """The logits of one output row (``row`` as the batch numbered it; -1 is the last)."""
    pointer = lib().llama_get_logits_ith(context_pointer, row)
    floats = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(floats, (n_vocab,))


def all_logits(context_pointer: Any, n_rows: int, n_vocab: int) -> np.ndarray:
    """The logits of ``n_rows`` output rows, shape ``(n_rows, n_vocab)``."""
    return np.ctypeslib.as_array(lib().llama_get_logits(context_pointer), (n_rows, n_vocab))


class OutputRows:
    """The last decode's output rows of one context as a ``(n_rows, n_vocab)`` view, read
    every step (the greedy argmax): ~1 µs. llama.h keeps the rows of the tokens marked as
    outputs contiguous, in batch order. Views are cached by buffer address (llama.cpp moves
    the buffer only when a decode needs more output rows than ever before): building one
    costs ~10 µs, and so does the ctypes pointer ``llama_get_logits`` returns, so the
    address is read through a binding of its own that returns a plain int."""

    def __init__(self, context_pointer: Any, n_vocab: int) -> None:
        self._pointer = context_pointer
        self._n_vocab = n_vocab
        self._address_of_logits = address_function("llama_get_logits")
        self._views: dict[tuple[int, int], np.ndarray] = {}  # (address, rows) -> view
        row_prototype = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
        self._address_of_row = row_prototype(("llama_get_logits_ith", library_handle()))
        self._rows: dict[int, np.ndarray] = {}  # address -> one row's view

    def __call__(self, n_rows: int) -> np.ndarray | None:
        """The view, or None when the last decode kept no logits."""
        address = self._address_of_logits(self._pointer)
        if not address:
            return None
        view = self._views.get((address, n_rows))
        if view is None:
            if len(self._views) >= 256:  # the buffer moved many times: start afresh
                self._views.clear()
            floats = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = np.ctypeslib.as_array(floats, (n_rows, self._n_vocab))
            self._views[(address, n_rows)] = view
        return view

    def row(self, index: int) -> np.ndarray:
        """The logits of batch row ``index`` (llama.cpp finds its output row), a view cached
        by address like the rows' view: ~1 µs where ``logits_row`` takes ~8."""
        address = self._address_of_row(self._pointer, index)
        if not address:
            raise IndexError(f"batch row {index} of the last decode has no logits")
        view = self._rows.get(address)
        if view is None:
            if len(self._rows) >= 1024:  # the buffer moved many times: start afresh
                self._rows.clear()
            floats = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = np.ctypeslib.as_array(floats, (self._n_vocab,))
            self._rows[address] = view
        return view


def address_function(name: str) -> Callable[[Any], int | None]:
    """llama.h's ``float * name(struct llama_context *)`` bound to return the address as an
    int (llama-cpp-python's own binding builds a ctypes pointer object on every call)."""
    prototype = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    function: Callable[[Any], int | None] = prototype((name, library_handle()))
    return function
