"""A llama.cpp context: the K/V cache, the compute buffers and ``llama_decode`` on a model.

:class:`ContextParams` holds what homelab chooses; everything else keeps llama.cpp's
defaults. Flash attention is either on or off, never llama.cpp's "auto", so that a plan's
memory figures (which depend on it) are what really happens. A failed creation raises
:class:`ContextCreateError` with llama.cpp's log (a quantized V cache without flash
attention, head sizes a quantized cache cannot hold, memory).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from homelab.errors import EngineError
from homelab.llamacpp._lib import Closing, lib
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.ggml_types import ggml_type_id
from homelab.llamacpp.lane import decode_on_lane, on_lane
from homelab.llamacpp.log import capture_log, is_memory_failure, joined, problem_lines
from homelab.llamacpp.memory import SequenceMemory
from homelab.llamacpp.model import Model
from homelab.settings import Settings

if TYPE_CHECKING:
    import numpy as np

FLASH_ATTN_DISABLED, FLASH_ATTN_ENABLED = 0, 1  # enum llama_flash_attn_type (-1 is auto)


@dataclass(frozen=True)
class ContextParams:
    """The context knobs homelab sets; the defaults are llama.cpp's own."""

    n_ctx: int = 4096  # total cells over all sequences (llama.cpp pads to 256)
    n_batch: int = 2048  # most tokens one llama_decode call takes
    n_ubatch: int = 512  # tokens computed at once (capped by n_batch)
    n_seq_max: int = 1  # sequences (the engine's slots)
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = False
    swa_full: bool = True  # full-size sliding-window caches (llama.cpp's default)
    kv_unified: bool = False  # one cache stream shared by all sequences
    n_threads: int | None = None  # None: llama.cpp's default

    @classmethod
    def from_settings(cls, settings: Settings) -> ContextParams:
        """The context a plan's settings describe (the engine and the dry run agree on it)."""
        return cls(
            n_ctx=settings.n_ctx,
            n_batch=settings.n_batch,
            n_ubatch=settings.n_ubatch,
            n_seq_max=settings.n_parallel,
            type_k=settings.type_k,
            type_v=settings.type_v,
            flash_attn=settings.flash_attn,
            swa_full=settings.swa_full,
            kv_unified=settings.kv_unified,
            n_threads=settings.n_threads,
        )

    def with_threads(self, n_threads: int) -> ContextParams:
        return replace(self, n_threads=n_threads)


class ContextCreateError(EngineError):
    """llama.cpp could not create a context; ``log_text`` is what it logged while trying."""

    def __init__(self, params: ContextParams, log_text: str) -> None:
        self.params = params
        self.log_text = log_text
        self.for_memory = is_memory_failure(log_text)
        self.reason = problem_lines(log_text)
        super().__init__(
            f"llama.cpp could not create the context: {self.reason}",
            hint="A quantized V cache needs flash attention, quantized caches need head sizes "
            "divisible by 32, and the cache must fit in memory.",
        )


class Context(Closing):
    """A context on a loaded model; free it with :meth:`close` before the model."""

    def __init__(
        self, pointer: Any, model: Model, params: ContextParams, creation_log: str
    ) -> None:
        self._lib = lib()
        self.pointer: Any = pointer
        self.model = model
        self.params = params
        self.creation_log = creation_log  # llama.cpp's log: cache and compute buffer sizes
        self.n_vocab = model.vocab.n_tokens
        one_stream = params.kv_unified or params.n_seq_max == 1
        self.memory = SequenceMemory(self._lib.llama_get_memory(pointer), one_stream=one_stream)
        from homelab.llamacpp.logits import OutputRows  # numpy: imported when a model loads

        self._output_rows = OutputRows(pointer, self.n_vocab)
        # output_logits(n_rows): the logits of the last decode's ``n_rows`` outputs, in batch
        # order, as a view ``(n_rows, n_vocab)`` valid until the next decode; None when it
        # kept none (the OutputRows itself: a greedy step calls it, one Python call fewer)
        self.output_logits: Callable[[int], np.ndarray | None] = self._output_rows

    @classmethod
    def create(cls, model: Model, params: ContextParams) -> Context:
        c_params = _c_params(params)
        with capture_log() as lines:
            pointer = lib().llama_init_from_model(model.pointer, c_params)
        if not pointer:
            raise ContextCreateError(params, joined(lines))
        return cls(pointer, model, params, joined(lines))

    # --- what llama.cpp made of the parameters ------------------------------------------------

    @property
    def n_ctx(self) -> int:
        """Cells over all sequences (after llama.cpp's padding)."""
        return int(self._lib.llama_n_ctx(self.pointer))

    @property
    def n_ctx_per_seq(self) -> int:
        """Cells one sequence can use."""
        return int(self._lib.llama_n_ctx_seq(self.pointer))

    @property
    def n_seq_max(self) -> int:
        return int(self._lib.llama_n_seq_max(self.pointer))

    @property
    def n_batch(self) -> int:
        return int(self._lib.llama_n_batch(self.pointer))

    @property
    def n_ubatch(self) -> int:
        return int(self._lib.llama_n_ubatch(self.pointer))

    # --- compute ---------------------------------------------------------------------------

    def decode(self, batch: Batch) -> int:
        """Run one ``llama_decode``: 0 on success, 1 when no cache slot was free, < 0 error.

        A failed call may leave part of the batch in the memory; the caller rolls back.
        """
        return decode_on_lane(self._lib.llama_decode, self.pointer, batch.c_batch)

    def decoder(self, batch: Batch) -> Callable[[], int]:
        """``decode(batch)`` bound once, for a caller that decodes the same batch object step
        after step on the lane (an engine's steady steps): a call of the C function itself,
        without a Python call in between (the batch's contents are read at each call). Off
        the lane, the plain ``decode`` (handed to the lane)."""
        if not on_lane():
            return functools.partial(self.decode, batch)
        return functools.partial(self._lib.llama_decode, self.pointer, batch.c_batch)

    def logits_row(self, row: int) -> np.ndarray:
        """The logits of one output row of the last decode (a view, valid until the next)."""
        return self._output_rows.row(row)

    def all_logits(self, n_rows: int) -> np.ndarray:
        """The logits of the last decode's ``n_rows`` rows, when every token was an output."""
        from homelab.llamacpp.logits import all_logits

        return all_logits(self.pointer, n_rows, self.n_vocab)

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        if self.pointer is not None:
            self._lib.llama_free(self.pointer)
            self.pointer = None


def _c_params(params: ContextParams) -> Any:
    c_params = lib().llama_context_default_params()
    c_params.n_ctx = params.n_ctx
    c_params.n_batch = params.n_batch
    c_params.n_ubatch = min(params.n_ubatch, params.n_batch)  # what llama.cpp makes of it
    c_params.n_seq_max = params.n_seq_max
    c_params.type_k = ggml_type_id(params.type_k)
    c_params.type_v = ggml_type_id(params.type_v)
    c_params.flash_attn_type = FLASH_ATTN_ENABLED if params.flash_attn else FLASH_ATTN_DISABLED
    c_params.swa_full = params.swa_full
    c_params.kv_unified = params.kv_unified
    c_params.no_perf = True  # homelab measures time itself
    if params.n_threads is not None:
        c_params.n_threads = c_params.n_threads_batch = params.n_threads
    return c_params
