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


def all_logits(context_pointer: Any, n_rows: int, n_vocab: int) -> np.ndarray:
    """The logits of ``n_rows`` output rows, shape ``(n_rows, n_vocab)``."""
    return np.ctypeslib.as_array(lib().llama_get_logits(context_pointer), (n_rows, n_vocab))


class OutputRows:
    """The last decode's outputs of one context as numpy views, read every step: all output
    rows as one ``(n_rows, n_vocab)`` view (the greedy argmax; llama.h keeps the rows of the
    tokens marked as outputs contiguous, in batch order), or one batch row's logits. ~1 µs
    each: the addresses come through bindings of their own that return plain ints (the
    ctypes pointer llama-cpp-python's binding builds costs ~7 µs), and views are cached by
    address (building one costs ~10 µs; llama.cpp moves the buffer only when a decode needs
    more output rows than ever before)."""

    def __init__(self, context_pointer: Any, n_vocab: int) -> None:
        self._pointer = context_pointer
        self._n_vocab = n_vocab
        self._address_of_logits = address_function("llama_get_logits")
        self._address_of_row = address_function("llama_get_logits_ith", ctypes.c_int32)
        self._views: dict[tuple[int, int], np.ndarray] = {}  # (address, rows or 0) -> view

    def __call__(self, n_rows: int) -> np.ndarray | None:
        """The view of all output rows, or None when the last decode kept no logits."""
        address = self._address_of_logits(self._pointer)
        if not address:
            return None
        view = self._views.get((address, n_rows))  # every step: no call when it is cached
        return self._view(address, n_rows) if view is None else view

    def row(self, index: int) -> np.ndarray:
        """The logits of batch row ``index`` (llama.cpp finds its output row; -1: the last)."""
        address = self._address_of_row(self._pointer, index)
        if not address:
            raise IndexError(f"batch row {index} of the last decode has no logits")
        return self._view(address, 0)

    def _view(self, address: int, n_rows: int) -> np.ndarray:
        """``(n_rows, n_vocab)`` logits at ``address`` (``n_rows`` 0: one row, ``(n_vocab,)``),
        cached by address."""
        view = self._views.get((address, n_rows))
        if view is None:
            if len(self._views) >= 1024:  # the buffer moved many times: start afresh
                self._views.clear()
            floats = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            shape = (n_rows, self._n_vocab) if n_rows else (self._n_vocab,)
            view = self._views[(address, n_rows)] = np.ctypeslib.as_array(floats, shape)
        return view


def address_function(name: str, *more_arguments: Any) -> Callable[..., int | None]:
    """llama.h's ``float * name(struct llama_context *, ...)`` bound to return the address as
    an int (llama-cpp-python's own binding builds a ctypes pointer object on every call)."""
    prototype = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, *more_arguments)
    function: Callable[..., int | None] = prototype((name, library_handle()))
    return function
