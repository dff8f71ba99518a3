"""A vision projector (mmproj GGUF) through llama.cpp's libmtmd: images into embeddings.

:class:`Projector` wraps one ``mtmd_context`` made for a loaded text :class:`Model`:

- :meth:`Projector.tokenize` reads a prompt whose images are marked by :attr:`marker` (one
  marker per image, in order) into :class:`PromptChunk` items — text chunks with their token
  ids, image chunks with the token and position counts mtmd gives them (an image's positions
  advance by ``max(rows, columns)`` on M-RoPE models, by its token count otherwise);
- :meth:`Projector.encode` runs the vision tower on one image and returns an
  :class:`EncodedImage`: its embeddings (one row per token, the text model's width) and
  their positions relative to the image's first position;
- :func:`decode_embeddings` decodes rows of those embeddings into one sequence of a
  :class:`~homelab.llamacpp.context.Context` — a ``llama_decode`` of its own (a batch holds
  token ids or embeddings, never both), with the model's causal mask lifted while it runs
  when the projector asks for that (Gemma 3 attends across an image both ways).

Bitmaps and chunk lists live only inside one call and are freed before it returns; the
context is freed by :meth:`Projector.close` (before the text model it was made for). mtmd's
log goes through homelab's (``log``): captured while loading, else warnings only.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from homelab.errors import EngineClosedError, EngineError, ModelFileError
from homelab.images.decoded import DecodedImage
from homelab.llamacpp import _lib
from homelab.llamacpp._lib import Closing, LlamaCppUnavailable, lib, to_bytes
from homelab.llamacpp.lane import decode_on_lane, run_on_lane
from homelab.llamacpp.log import capture_log, is_memory_failure, joined, problem_lines

if TYPE_CHECKING:
    import numpy as np

    from homelab.llamacpp.context import Context
    from homelab.llamacpp.model import Model

CHUNK_TEXT, CHUNK_IMAGE = 0, 1  # enum mtmd_input_chunk_type (audio is 2)
FLASH_ATTN_AUTO = -1
MROPE_SECTIONS = 4  # positions per embedding on M-RoPE models (t, y, x, unused)
TOKENIZE_ERRORS = {1: "the images do not match the prompt's markers", 2: "mtmd refused them"}
_log_installed = threading.Lock()
_log_done = False


def mtmd_bindings() -> ModuleType:
    """llama-cpp-python's libmtmd bindings, mtmd's log routed through homelab's."""
    global _log_done
    lib()  # llama.cpp first: backend init and the log callback
    try:
        import llama_cpp.mtmd_cpp as mtmd
    except Exception as error:  # ImportError, or OSError from libmtmd.so
        raise LlamaCppUnavailable(error) from error
    if not _log_done:
        with _log_installed:
            if not _log_done:
                mtmd.mtmd_log_set(_lib._callback, ctypes.c_void_p(0))
                mtmd.mtmd_helper_log_set(_lib._callback, ctypes.c_void_p(0))
                _log_done = True
    return mtmd


@dataclass(frozen=True)
class ProjectorParams:
    """What homelab chooses when it loads a projector; the rest keeps mtmd's defaults."""

    use_gpu: bool = True  # the projector's weights and compute on the GPU (when there is one)
    n_threads: int = 4
    image_max_tokens: int = 0  # most tokens an image may take (0: the projector's own limit)
    warmup: bool = True  # reserve the compute buffer for the largest image now, not later


@dataclass(frozen=True)
class PromptChunk:
    """One piece of a tokenized prompt: text tokens, or an image (``image_index`` >= 0)."""

    tokens: tuple[int, ...]  # the text's token ids; () for an image
    n_tokens: int  # KV cells it takes
    n_pos: int  # positions it advances (an image on an M-RoPE model: max(rows, columns))
    image_index: int = -1  # which image of the prompt (in marker order); -1 for text


@dataclass(frozen=True)
class EncodedImage:
    """The vision tower's output for one image, ready to decode into a sequence."""

    embeddings: np.ndarray  # float32 [n_tokens, n_embd]
    relative_positions: np.ndarray  # int32 [n_sections, n_tokens]: positions from pos 0
    n_pos: int
    encode_s: float

    @property
    def n_tokens(self) -> int:
        return int(self.embeddings.shape[0])


class ProjectorLoadError(EngineError):
    """mtmd refused a projector file; ``log_text`` is what it logged while trying."""

    def __init__(self, path: Path, log_text: str) -> None:
        self.log_text = log_text
        self.for_memory = is_memory_failure(log_text)
        self.reason = problem_lines(log_text)
        hint = (
            "Put the projector on the CPU (--mmproj-cpu), or start without it (--no-mmproj)."
            if self.for_memory
            else "Check that the mmproj file belongs to this model (same family and width), "
            "or start without it (--no-mmproj)."
        )
        super().__init__(
            f"llama.cpp could not load the vision projector {path.name}: {self.reason}",
            hint=hint,
        )


class Projector(Closing):
    """An mtmd context for one text model; free it with :meth:`close` before the model."""

    def __init__(self, pointer: Any, path: Path, n_embd: int, creation_log: str) -> None:
        self._mtmd = mtmd_bindings()
        self.pointer: Any = pointer
        self.path = path
        self.n_embd = n_embd  # the text model's input width = the projector's output
        self.creation_log = creation_log
        self.marker = (self._mtmd.mtmd_get_marker(pointer) or b"").decode()
        self.uses_mrope = bool(self._mtmd.mtmd_decode_use_mrope(pointer))
        self.non_causal = bool(self._mtmd.mtmd_decode_use_non_causal(pointer, None))
        if not self._mtmd.mtmd_support_vision(pointer):
            self.close()
            raise EngineError(
                f"{path.name} is not a vision projector (it has no image encoder)",
                hint="Give the model's mmproj file for images.",
            )

    @classmethod
    def load(cls, path: str | Path, model: Model, params: ProjectorParams) -> Projector:
        """Load ``path`` for ``model``; raises ProjectorLoadError with mtmd's reason."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise ModelFileError(path, "vision projector not found", hint="Check --mmproj.")
        mtmd = mtmd_bindings()
        c_params = projector_c_params(mtmd, params)
        with capture_log() as lines:
            pointer = mtmd.mtmd_init_from_file(to_bytes(path), model.pointer, c_params)
        if not pointer:
            raise ProjectorLoadError(path, joined(lines))
        n_embd = int(lib().llama_model_n_embd_inp(model.pointer))
        return cls(pointer, path, n_embd, joined(lines))

    # --- prompts ---------------------------------------------------------------------------

    def tokenize(
        self, text: str, images: Sequence[DecodedImage], *, add_special: bool = True
    ) -> list[PromptChunk]:
        """``text`` with one :attr:`marker` per image, as mtmd splits it (any thread)."""
        n_markers = text.count(self.marker)
        if n_markers != len(images):
            raise EngineError(
                f"the prompt marks {n_markers} image(s) but {len(images)} were given",
                hint=f"Put one {self.marker} where each image goes.",
            )
        with self._chunks(text, images, add_special) as chunks:
            return list(self._read_chunks(chunks))

    def _read_chunks(self, chunks: Any) -> Iterator[PromptChunk]:
        mtmd, n_images = self._mtmd, 0
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
            if kind == CHUNK_TEXT:
                yield PromptChunk(_text_tokens(mtmd, chunk), n_tokens, n_pos)
            elif kind == CHUNK_IMAGE:
                yield PromptChunk((), n_tokens, n_pos, n_images)
                n_images += 1
            else:
                raise EngineError("the prompt holds audio, which homelab does not take")

    @contextmanager
    def _chunks(
        self, text: str, images: Sequence[DecodedImage], add_special: bool
    ) -> Iterator[Any]:
        if self.pointer is None:  # closed with its engine: mtmd would crash the process
            raise EngineClosedError("the vision projector is closed (its engine is shut down)")
        mtmd = self._mtmd
        bitmaps = [_bitmap(mtmd, image) for image in images]
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            encoded = text.encode()
            c_text = mtmd.mtmd_input_text(encoded, len(encoded), add_special, True)
            array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            with capture_log() as lines:
                status = mtmd.mtmd_tokenize(
                    self.pointer, chunks, ctypes.byref(c_text), array, len(bitmaps)
                )
            if status != 0:
                reason = TOKENIZE_ERRORS.get(status, f"mtmd_tokenize failed ({status})")
                raise EngineError(f"cannot read the prompt's images: {reason}: {joined(lines)}")
            yield chunks
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    # --- images ----------------------------------------------------------------------------

    def encode(self, image: DecodedImage) -> EncodedImage:
        """Run the vision tower on ``image`` (on the compute lane): its embeddings and their
        relative positions. The embeddings are copied: mtmd reuses its buffer."""
        return run_on_lane(lambda: self._encode(image))

    def _encode(self, image: DecodedImage) -> EncodedImage:
        import time

        with self._chunks(self.marker, [image], False) as chunks:
            chunk = self._image_chunk(chunks)
            started = time.perf_counter()
            if self._mtmd.mtmd_encode_chunk(self.pointer, chunk) != 0:
                raise EngineError(
                    f"the vision projector failed to encode a {image.width_px}x"
                    f"{image.height_px} image",
                    hint="See the log; a projector on a GPU may be out of memory.",
                )
            encode_s = time.perf_counter() - started
            n_tokens = int(self._mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            rows = self._output_rows(n_tokens)
            positions = self._relative_positions(chunk, n_tokens)
            n_pos = int(self._mtmd.mtmd_input_chunk_get_n_pos(chunk))
        return EncodedImage(rows, positions, n_pos, encode_s)

    def _image_chunk(self, chunks: Any) -> Any:
        mtmd = self._mtmd
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            if mtmd.mtmd_input_chunk_get_type(chunk) == CHUNK_IMAGE:
                return chunk
        raise EngineError("mtmd made no image chunk of an image (a homelab bug)")

    def _output_rows(self, n_tokens: int) -> np.ndarray:
        import numpy as np

        pointer = self._mtmd.mtmd_get_output_embd(self.pointer)
        flat = np.ctypeslib.as_array(pointer, shape=(n_tokens * self.n_embd,))
        return flat.reshape(n_tokens, self.n_embd).copy()

    def _relative_positions(self, chunk: Any, n_tokens: int) -> np.ndarray:
        """[sections, n_tokens] positions from 0: (t, y, x, 0) per token with M-RoPE, as
        llama.cpp's batch takes them; 0, 1, 2... otherwise."""
        import numpy as np

        if not self.uses_mrope:
            return np.arange(n_tokens, dtype=np.int32).reshape(1, n_tokens)
        mtmd = self._mtmd
        out = (mtmd.mtmd_decoder_pos * n_tokens)()
        tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
        mtmd.mtmd_helper_image_get_decoder_pos(tokens, 0, out)
        positions = np.zeros((MROPE_SECTIONS, n_tokens), dtype=np.int32)
        for i, pos in enumerate(out):
            positions[0, i], positions[1, i], positions[2, i] = pos.t, pos.y, pos.x
        return positions

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        if self.pointer is not None:
            self._mtmd.mtmd_free(self.pointer)
            self.pointer = None


def projector_c_params(mtmd: ModuleType, params: ProjectorParams) -> Any:
    c_params = mtmd.mtmd_context_params_default()
    c_params.use_gpu = params.use_gpu
    c_params.print_timings = False
    c_params.n_threads = params.n_threads
    c_params.warmup = params.warmup
    c_params.flash_attn_type = FLASH_ATTN_AUTO
    if params.image_max_tokens > 0:
        c_params.image_max_tokens = params.image_max_tokens
    return c_params


def _bitmap(mtmd: ModuleType, image: DecodedImage) -> Any:
    """A bitmap of ``image``'s pixels (mtmd copies them), its id the pixel digest."""
    data = (ctypes.c_uint8 * len(image.rgb)).from_buffer_copy(image.rgb)
    bitmap = mtmd.mtmd_bitmap_init(image.width_px, image.height_px, data)
    if not bitmap:
        raise EngineError(f"mtmd could not take a {image.width_px}x{image.height_px} image")
    mtmd.mtmd_bitmap_set_id(bitmap, image.digest.encode())
    return bitmap


def _text_tokens(mtmd: ModuleType, chunk: Any) -> tuple[int, ...]:
    count = ctypes.c_size_t(0)
    pointer = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
    return tuple(pointer[i] for i in range(count.value))


# --- decoding embeddings into a sequence ---------------------------------------------------


class _EmbeddingsBatch(ctypes.Structure):
    """``struct llama_batch`` over numpy arrays (M-RoPE needs 4 positions a row, more than
    ``llama_batch_init`` allocates)."""

    _fields_ = [
        ("n_tokens", ctypes.c_int32),
        ("token", ctypes.c_void_p),
        ("embd", ctypes.POINTER(ctypes.c_float)),
        ("pos", ctypes.POINTER(ctypes.c_int32)),
        ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
        ("seq_id", ctypes.POINTER(ctypes.POINTER(ctypes.c_int32))),
        ("logits", ctypes.POINTER(ctypes.c_int8)),
    ]


def decode_embeddings(
    context: Context,
    rows: np.ndarray,
    positions: np.ndarray,
    seq_id: int,
    *,
    non_causal: bool,
) -> int:
    """Decode ``rows`` (float32 [n, n_embd]) at ``positions`` (int32 [sections, n], absolute)
    into ``seq_id``; llama_decode's status (0 ok). Runs on the compute lane."""
    import numpy as np

    n = int(rows.shape[0])
    embd = np.ascontiguousarray(rows, dtype=np.float32)
    pos = np.ascontiguousarray(positions, dtype=np.int32).reshape(-1)
    seq = ctypes.c_int32(seq_id)  # every row's one sequence id
    seq_rows = (ctypes.POINTER(ctypes.c_int32) * n)(*[ctypes.pointer(seq)] * n)
    n_seq_id = np.ones(n, dtype=np.int32)
    logits = np.zeros(n, dtype=np.int8)
    batch = _EmbeddingsBatch(
        n,
        None,
        embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        seq_rows,
        logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
    )
    llama, pointer = lib(), context.pointer

    def decode() -> int:
        if non_causal:
            llama.llama_set_causal_attn(pointer, False)
        try:
            return int(llama.llama_decode(pointer, _as_llama_batch(llama, batch)))
        finally:
            if non_causal:
                llama.llama_set_causal_attn(pointer, True)

    return decode_on_lane(decode)


def _as_llama_batch(llama: ModuleType, batch: _EmbeddingsBatch) -> Any:
    """The same bytes seen as llama-cpp-python's ``llama_batch`` (its argtype)."""
    return llama.llama_batch.from_buffer(batch)
