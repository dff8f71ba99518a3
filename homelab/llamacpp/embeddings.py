"""A llama.cpp context that computes embeddings: one pooled vector per sequence of a batch.

:class:`EmbeddingContext` is a context made with ``embeddings = true`` and a pooling type —
the model's own (``{arch}.pooling_type`` in the GGUF, e.g. mean for BERT) or one the caller
names (``mean``, ``cls``, ``last``: what a causal model needs, its metadata says none). Each
``llama_decode`` of a batch of whole sequences leaves one pooled vector per sequence, read
with ``llama_get_embeddings_seq``.

Facts this relies on (llama.cpp as vendored by llama-cpp-python 0.3.36, measured with the
demo models):

- A pooled vector is computed per ubatch: a sequence split over two ubatches would get the
  second part's pool only. So ``n_ubatch = n_batch`` here, and the caller puts only whole
  sequences of at most ``n_batch`` tokens in a batch.
- Non-causal models (BERT) have no memory (``llama_get_memory`` is NULL; ``llama_decode``
  runs ``llama_encode``) and need every token of a batch in one ubatch — the same rule.
- Causal models keep a K/V cache: :meth:`EmbeddingContext.clear` empties it before each
  batch, so sequence ids (and positions from 0) can be reused.
- Sequences in one batch do not see each other: a text's vector is the same alone or batched
  (to float rounding).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from homelab.errors import EngineError
from homelab.llamacpp._lib import Closing, lib
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import ContextCreateError, ContextParams
from homelab.llamacpp.lane import decode_on_lane
from homelab.llamacpp.log import capture_log, joined
from homelab.llamacpp.model import Model

if TYPE_CHECKING:
    import numpy as np

# enum llama_pooling_type (UNSPECIFIED = -1: the model's own)
POOLING_IDS = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
POOLING_NAMES = {value: name for name, value in POOLING_IDS.items()}
CALLER_POOLINGS = ("mean", "cls", "last")  # what a caller may ask of a causal model
MODEL_POOLING = -1
FLASH_ATTN_DISABLED = 0


@dataclass(frozen=True)
class EmbeddingParams:
    """What an embedding context is made with."""

    n_ctx: int = 2048  # cells shared by the sequences of one decode (a causal model's K/V)
    n_batch: int = 2048  # tokens per decode, also the ubatch: the longest input that fits
    n_seq_max: int = 8  # sequences per decode
    pooling: str | None = None  # None: the model's own (its GGUF metadata)
    n_threads: int | None = None  # None: llama.cpp's default

    def context_params(self) -> ContextParams:
        """The same numbers as the generation contexts' parameters (for errors and logs)."""
        return ContextParams(
            n_ctx=self.n_ctx, n_batch=self.n_batch, n_ubatch=self.n_batch, n_seq_max=self.n_seq_max
        )


class EmbeddingContext(Closing):
    """An embeddings context on a loaded model; free it with :meth:`close` before the model."""

    def __init__(self, pointer: Any, model: Model, params: EmbeddingParams, log_text: str) -> None:
        self._lib = lib()
        self.pointer: Any = pointer
        self.model = model
        self.params = params
        self.creation_log = log_text  # llama.cpp's log: cache and compute buffer sizes
        self._memory = self._lib.llama_get_memory(pointer)  # None for non-causal models

    @classmethod
    def create(cls, model: Model, params: EmbeddingParams) -> EmbeddingContext:
        if params.pooling is not None and params.pooling not in POOLING_IDS:
            raise EngineError(
                f"unknown pooling type {params.pooling!r}",
                hint=f"Choose one of {', '.join(CALLER_POOLINGS)}.",
            )
        c_params = _c_params(params)
        with capture_log() as lines:
            pointer = lib().llama_init_from_model(model.pointer, c_params)
        if not pointer:
            raise ContextCreateError(params.context_params(), joined(lines))
        return cls(pointer, model, params, joined(lines))

    # --- what llama.cpp made of it ---------------------------------------------------------

    @property
    def pooling(self) -> str:
        """The pooling in effect: ``none`` means the context gives no per-sequence vector."""
        return POOLING_NAMES.get(int(self._lib.llama_pooling_type(self.pointer)), "none")

    @property
    def n_embd(self) -> int:
        """Floats in one pooled vector (the model's output width)."""
        return int(self._lib.llama_model_n_embd_out(self.model.pointer))

    @property
    def n_batch(self) -> int:
        return int(self._lib.llama_n_batch(self.pointer))

    @property
    def n_seq_max(self) -> int:
        return int(self._lib.llama_n_seq_max(self.pointer))

    @property
    def n_ctx_per_seq(self) -> int:
        """Cells one sequence can use (a causal model's cache; the batch bounds BERT's)."""
        return int(self._lib.llama_n_ctx_seq(self.pointer))

    @property
    def n_ctx_train(self) -> int:
        """The context the model was trained for (BERT has that many learned positions)."""
        return int(self._lib.llama_model_n_ctx_train(self.model.pointer))

    # --- compute ---------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget every sequence (a causal model's cache; nothing to do for BERT)."""
        if self._memory:
            self._lib.llama_memory_clear(self._memory, True)

    def decode(self, batch: Batch) -> int:
        """One ``llama_decode`` of whole sequences: 0 on success (see llama.h otherwise)."""
        return decode_on_lane(self._lib.llama_decode, self.pointer, batch.c_batch)

    def sequence_vector(self, seq_id: int) -> np.ndarray:
        """A copy of ``seq_id``'s pooled vector from the last decode."""
        import numpy as np

        pointer = self._lib.llama_get_embeddings_seq(self.pointer, seq_id)
        if not pointer:
            raise EngineError(
                f"llama.cpp returned no pooled vector for sequence {seq_id}",
                hint="The context has no pooling: name one (mean, cls, last).",
            )
        floats = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(floats, (self.n_embd,)).copy()

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        if self.pointer is not None:
            self._lib.llama_free(self.pointer)
            self.pointer = None
            self._memory = None


def _c_params(params: EmbeddingParams) -> Any:
    c_params = lib().llama_context_default_params()
    c_params.n_ctx = params.n_ctx
    c_params.n_batch = c_params.n_ubatch = params.n_batch  # a sequence never spans ubatches
    c_params.n_seq_max = params.n_seq_max
    c_params.kv_unified = True  # the sequences of one decode share n_ctx cells
    c_params.embeddings = True
    c_params.pooling_type = MODEL_POOLING if params.pooling is None else POOLING_IDS[params.pooling]
    c_params.flash_attn_type = FLASH_ATTN_DISABLED  # the planner's arithmetic assumes it off
    c_params.no_perf = True
    if params.n_threads is not None:
        c_params.n_threads = c_params.n_threads_batch = params.n_threads
    return c_params
