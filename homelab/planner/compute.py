"""Compute-buffer estimate: the peak of llama.cpp's worst-case graph (one ubatch).

llama.cpp reserves, per backend, the largest memory ggml's graph allocator needs while running a
ubatch of ``n_tokens = min(n_ctx, n_ubatch)`` tokens with every output requested. The peak is
one of a few moments, whichever is largest:

* **output**: the f32 logits, ``4 × n_vocab`` bytes per token, plus a few hidden-state rows;
* **attention** in some layer: without flash attention the f32 scores ``4 × n_head × n_kv`` per
  token; the KQ masks (f32, or f16 with flash attention, one per cache kind still to be used);
  the Q/K/V projections and residual rows;
* **feed-forward** in some layer: gate/up/activation rows (``n_ff``, or ``n_expert_used ×
  n_ff_exp`` for MoE) plus residual rows and the masks still alive;
* **recurrent** layers (Mamba): the projected and convolved rows, about ``6.5 × d_inner``
  floats per token, plus the SSM states.

The per-token row counts (5, 3, 4, 6.5 …) were calibrated on CPU dry runs of the demo models
(vendored llama.cpp, ``sched_reserve: CPU compute buffer size``); the structure is what makes
the estimate carry over to other sizes. Fragmentation in ggml's allocator is not modelled; the
tests hold the formula to 5% (or 0.5 MiB) of the real buffers of the demo models.
"""

from __future__ import annotations

from dataclasses import dataclass

from homelab.gguf.model import ModelInfo
from homelab.planner.cache import ContextShape, context_shape, is_quantized, kv_cells
from homelab.planner.geometry import CacheGeometry, cache_geometry, int_key
from homelab.settings import Settings

F32 = 4
# f32 hidden-state rows per token alive next to the logits; ggml's allocator adds 0-9%
# fragmentation there, these are the midpoints of what the demo models measure.
OUTPUT_HIDDEN_ROWS = 3.9
OUTPUT_HIDDEN_ROWS_MLA = 5.0
ATTENTION_HIDDEN_ROWS = 5  # residual, norm, Q, attention output, projection
ATTENTION_KV_ROWS = 2  # K and V projections (for MLA: every head's latent K)
MAMBA_INNER_ROWS = 6.5


@dataclass(frozen=True)
class GraphPart:
    """The blocks (and whether the input and output layers) one backend runs."""

    layers: frozenset[int]
    has_output: bool
    has_input: bool


@dataclass(frozen=True)
class GraphFacts:
    """What the compute estimate needs from a model, precomputed once."""

    geometry: CacheGeometry
    n_embd: int
    n_vocab: int
    n_head: tuple[int, ...]
    ffn_rows: tuple[int, ...]  # f32 rows per token at each block's feed-forward peak
    attention_rows: tuple[int, ...]  # f32 rows per token at each block's attention peak
    mask_layers: tuple[tuple[int, ...], ...]  # per block: one sample layer per mask still used
    recurrent_rows: float  # f32 rows per token in a recurrent block
    recurrent_state_bytes: int  # SSM state bytes per sequence the scan outputs


def graph_facts(model: ModelInfo) -> GraphFacts:
    geometry = cache_geometry(model)
    return GraphFacts(
        geometry=geometry,
        n_embd=model.n_embd,
        n_vocab=model.n_vocab,
        n_head=model.n_head,
        ffn_rows=tuple(_ffn_rows(model, layer) for layer in range(model.n_layer)),
        attention_rows=tuple(
            _attention_rows(model, geometry, layer) for layer in range(model.n_layer)
        ),
        mask_layers=_mask_layers(geometry),
        recurrent_rows=MAMBA_INNER_ROWS * model.ssm_d_inner
        if model.ssm_d_inner
        else 4 * model.n_embd,
        recurrent_state_bytes=F32 * model.ssm_d_state * model.ssm_d_inner,
    )


def whole_graph(n_layer: int) -> GraphPart:
    return GraphPart(frozenset(range(n_layer)), has_output=True, has_input=True)


def compute_bytes(
    facts: GraphFacts, settings: Settings, part: GraphPart | None = None, cuda: bool = False
) -> int:
    """Compute buffer of the backend running ``part`` (default: the whole graph, on the CPU)."""
    geometry = facts.geometry
    part = part or whole_graph(geometry.n_layer)
    shape = context_shape(settings)
    tokens = shape.n_tokens_reserve
    peaks = [0]
    if part.has_output:
        peaks.append(_output_peak(facts, tokens))
    if part.has_input:
        peaks.append(tokens * F32 * 2 * facts.n_embd)
    for layer in part.layers:
        if layer < geometry.n_layer_trunk:
            peaks.append(_layer_peak(facts, shape, settings, layer, cuda))
    return max(peaks)


def model_compute_bytes(model: ModelInfo, settings: Settings) -> int:
    """The CPU compute buffer of the whole graph (what a CPU-only load reserves)."""
    return compute_bytes(graph_facts(model), settings)


def _output_peak(facts: GraphFacts, tokens: int) -> int:
    rows = OUTPUT_HIDDEN_ROWS_MLA if facts.geometry.mla else OUTPUT_HIDDEN_ROWS
    return int(tokens * F32 * (facts.n_vocab + rows * facts.n_embd))


def _layer_peak(
    facts: GraphFacts, shape: ContextShape, settings: Settings, layer: int, cuda: bool
) -> int:
    geometry = facts.geometry
    tokens = shape.n_tokens_reserve
    if layer not in geometry.kv_layers and layer in geometry.recurrent_layers:
        states = facts.recurrent_state_bytes * max(1, settings.n_parallel)
        return int(tokens * F32 * facts.recurrent_rows) + states
    element = 2 if settings.flash_attn else F32
    masks = sum(
        element * kv_cells(geometry, shape, settings, il) for il in facts.mask_layers[layer]
    )
    attention = tokens * (masks + F32 * facts.attention_rows[layer])
    if not settings.flash_attn and layer in geometry.kv_layers:
        attention += tokens * F32 * facts.n_head[layer] * kv_cells(geometry, shape, settings, layer)
    if cuda and settings.flash_attn and layer in geometry.kv_layers:
        attention += _f16_cache_copies(geometry, shape, settings, layer)
    ffn = tokens * (masks + F32 * facts.ffn_rows[layer])
    return max(attention, ffn)


def _mask_layers(geometry: CacheGeometry) -> tuple[tuple[int, ...], ...]:
    """For each block, one cached layer per mask (full / sliding) that is still to be used."""
    result = []
    for layer in range(geometry.n_layer):
        samples: dict[bool, int] = {}
        for il in geometry.kv_layers:
            if il >= layer:
                samples.setdefault(geometry.swa[il], il)
        result.append(tuple(samples.values()))
    return tuple(result)


def _attention_rows(model: ModelInfo, geometry: CacheGeometry, layer: int) -> int:
    # absorbed MLA: every head attends the shared latent K
    projected = model.n_head[layer] * model.head_dim_k if geometry.mla else geometry.k_width[layer]
    return ATTENTION_HIDDEN_ROWS * model.n_embd + ATTENTION_KV_ROWS * projected


def _f16_cache_copies(
    geometry: CacheGeometry, shape: ContextShape, settings: Settings, layer: int
) -> int:
    """CUDA flash attention converts a quantized K/V view to f16 for prompt batches."""
    cells = kv_cells(geometry, shape, settings, layer) * shape.n_stream
    copies = 0
    if is_quantized(settings.type_k):
        copies += 2 * cells * geometry.k_width[layer]
    if is_quantized(settings.type_v) and not geometry.mla:
        copies += 2 * cells * geometry.v_width[layer]
    return copies


def _ffn_rows(model: ModelInfo, layer: int) -> int:
    """f32 rows per token alive at the feed-forward peak of ``layer``."""
    experts = _expert_widths(model, layer)
    if experts is None:
        return 3 * model.n_embd + 3 * model.n_ff
    n_ff_exp, n_used = experts
    return 4 * model.n_embd + 3 * n_used * n_ff_exp


def _expert_widths(model: ModelInfo, layer: int) -> tuple[int, int] | None:
    """(n_ff_exp, n_expert_used) when ``layer`` has routed experts, else None."""
    if not model.is_moe:
        return None
    for tensor in model.layer_tensors(layer):
        if tensor.name.endswith("ffn_up_exps.weight") and len(tensor.shape) == 3:
            return tensor.shape[1], model.n_expert_used
    if layer < int_key(model, "leading_dense_block_count"):
        return None
    n_ff_exp = int_key(model, "expert_feed_forward_length") or model.n_ff
    return n_ff_exp, model.n_expert_used
