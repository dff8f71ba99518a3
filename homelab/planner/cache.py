"""KV cache and recurrent-state sizes, byte for byte as llama.cpp allocates them.

* ``n_ctx`` is padded to 256; without a unified cache each of the ``n_parallel`` sequences gets
  ``pad256(n_ctx / n_parallel)`` cells and the total becomes that times ``n_parallel``
  (``llama_context`` constructor, ``src/llama-context.cpp``).
* Every layer with a cache holds ``n_stream × cells × (row(type_k, n_embd_k_gqa) +
  row(type_v, n_embd_v_gqa))`` bytes (``llama_kv_cache`` constructor). MLA caches hold K only.
  Without flash attention V is stored transposed and padded to the widest layer.
* Sliding-window layers get ``pad256(min(n_ctx_seq, n_swa + n_ubatch))`` cells unless
  ``swa_full`` (``llama_kv_cache_iswa``), where ``n_ubatch`` is the effective one (capped by
  ``n_batch``, itself capped by the requested ``n_ctx``).
* Recurrent state is f32: ``(n_embd_r + n_embd_s) × 4`` bytes per layer per sequence
  (``llama_memory_recurrent``), independent of the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from homelab.errors import PlanError
from homelab.gguf.model import ModelInfo
from homelab.planner.geometry import CacheGeometry, cache_geometry
from homelab.settings import QUANTIZED_KV_TYPES, Settings

CTX_PAD = 256  # llama.cpp pads n_ctx, n_ctx_seq and the SWA cache to this

# ggml cache types: (elements per block, bytes per block); their ids live in homelab.llamacpp.
CACHE_TYPE_BLOCKS: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q5_1": (32, 24),
    "q5_0": (32, 22),
    "q4_1": (32, 20),
    "q4_0": (32, 18),
    "iq4_nl": (32, 18),
}
QUANTIZED_CACHE_TYPES = frozenset(QUANTIZED_KV_TYPES)


def pad(value: int, multiple: int = CTX_PAD) -> int:
    return (value + multiple - 1) // multiple * multiple


def is_quantized(cache_type: str) -> bool:
    return cache_type in QUANTIZED_CACHE_TYPES


def row_bytes(cache_type: str, n_elements: int) -> int:
    """Bytes of one cache row of ``n_elements`` values (ggml_row_size)."""
    try:
        block_elements, block_bytes = CACHE_TYPE_BLOCKS[cache_type]
    except KeyError:
        known = ", ".join(CACHE_TYPE_BLOCKS)
        raise PlanError(
            f"Unknown KV cache type {cache_type!r}.", hint=f"Use one of {known}."
        ) from None
    if n_elements % block_elements:
        raise PlanError(
            f"A {cache_type} cache needs rows that are a multiple of {block_elements} values; "
            f"this model's rows hold {n_elements}.",
            hint="Use an f16 cache for this model.",
        )
    return n_elements // block_elements * block_bytes


# --- context -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextShape:
    """The sizes llama.cpp derives from the context parameters (``llama_context`` constructor)."""

    n_ctx: int  # cells over all sequences, after padding
    n_ctx_seq: int  # cells one sequence can use
    n_stream: int  # separate KV streams (n_parallel, or 1 with a unified cache)
    n_batch: int
    n_ubatch: int
    n_tokens_reserve: int  # tokens of the worst-case graph llama.cpp reserves compute for

    @property
    def cells_per_stream(self) -> int:
        return self.n_ctx if self.n_stream == 1 else self.n_ctx_seq


def context_shape(settings: Settings) -> ContextShape:
    if settings.n_ctx <= 0 or settings.n_parallel <= 0:
        raise PlanError("The context and the number of slots must be positive.")
    n_batch = min(settings.n_ctx, settings.n_batch)  # causal attention caps the batch
    n_ubatch = min(n_batch, settings.n_ubatch)
    n_ctx = pad(settings.n_ctx)
    if settings.kv_unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq = pad(n_ctx // settings.n_parallel)
        n_ctx, n_stream = n_ctx_seq * settings.n_parallel, settings.n_parallel
    tokens = min(n_ctx, n_ubatch) // settings.n_parallel * settings.n_parallel
    return ContextShape(n_ctx, n_ctx_seq, n_stream, n_batch, n_ubatch, max(tokens, 1))


def slot_settings_ctx(n_ctx_per_slot: int, n_parallel: int) -> int:
    """The total ``n_ctx`` that gives each of ``n_parallel`` slots ``n_ctx_per_slot`` cells."""
    return pad(n_ctx_per_slot) * n_parallel


# --- KV cache and recurrent state ----------------------------------------------------------


def kv_cells(geometry: CacheGeometry, shape: ContextShape, settings: Settings, layer: int) -> int:
    """Cells of one stream of ``layer``'s cache."""
    return cache_cells(geometry, shape, settings, geometry.swa[layer])


def cache_cells(
    geometry: CacheGeometry, shape: ContextShape, settings: Settings, sliding_window: bool
) -> int:
    """Cells of one stream of the full-attention cache, or of the sliding-window cache."""
    cells = shape.cells_per_stream
    if sliding_window and not settings.swa_full:
        window = geometry.n_swa * (settings.n_parallel if settings.kv_unified else 1)
        return pad(min(cells, window + shape.n_ubatch))
    return cells


def kv_row_bytes(geometry: CacheGeometry, settings: Settings, layer: int) -> tuple[int, int]:
    """Bytes of one cell's K row and V row in ``layer`` (V is 0 for MLA)."""
    k = row_bytes(settings.type_k, geometry.k_width[layer])
    if geometry.mla:
        return k, 0
    # without flash attention V is stored transposed and padded to the widest layer
    v_width = geometry.v_width[layer] if settings.flash_attn else geometry.v_width_max
    return k, row_bytes(settings.type_v, v_width)


def kv_bytes_by_layer(geometry: CacheGeometry, settings: Settings) -> dict[int, int]:
    """Bytes of each cached layer's K and V tensors (all streams)."""
    shape = context_shape(settings)
    sizes = {}
    for layer in geometry.kv_layers:
        k, v = kv_row_bytes(geometry, settings, layer)
        sizes[layer] = shape.n_stream * kv_cells(geometry, shape, settings, layer) * (k + v)
    return sizes


@dataclass(frozen=True)
class KvCacheSize:
    """One of llama.cpp's KV caches as its ``llama_kv_cache: size = ...`` log line shows it."""

    sliding_window: bool
    cells: int  # per stream
    layers: int
    k_bytes: int
    v_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


def kv_caches(geometry: CacheGeometry, settings: Settings) -> list[KvCacheSize]:
    """The caches llama.cpp creates, in its order: the full-attention one, then the SWA one."""
    if not geometry.kv_layers:
        return []
    shape = context_shape(settings)
    caches = []
    for swa in (False, True) if geometry.has_swa else (False,):
        layers = [il for il in geometry.kv_layers if geometry.swa[il] == swa]
        cells = cache_cells(geometry, shape, settings, swa) * shape.n_stream
        rows = [kv_row_bytes(geometry, settings, il) for il in layers]
        k = sum(row[0] for row in rows) * cells
        v = sum(row[1] for row in rows) * cells
        caches.append(KvCacheSize(swa, cells // shape.n_stream, len(layers), k, v))
    return caches


def recurrent_bytes_by_layer(geometry: CacheGeometry, settings: Settings) -> dict[int, int]:
    """f32 conv/SSM state of every sequence, per recurrent layer (``llama_memory_recurrent``)."""
    per_layer = 4 * (geometry.r_width + geometry.s_width) * max(1, settings.n_parallel)
    return dict.fromkeys(geometry.recurrent_layers, per_layer)


def kv_bytes(model: ModelInfo, settings: Settings) -> int:
    """Total KV cache bytes llama.cpp allocates for ``model`` with ``settings``."""
    return sum(kv_bytes_by_layer(cache_geometry(model), settings).values())


def recurrent_bytes(model: ModelInfo, settings: Settings) -> int:
    """Total recurrent-state bytes (0 for models without recurrent layers)."""
    return sum(recurrent_bytes_by_layer(cache_geometry(model), settings).values())
