"""What llama.cpp's memory module allocates per layer, read from a :class:`ModelInfo`.

Mirrors ``llama_hparams`` (vendored llama.cpp ``src/llama-hparams.cpp``) and the memory
constructors (``llama_model::create_memory``): which layers own a KV cache, how wide their K and
V rows are (``n_embd_k_gqa`` / ``n_embd_v_gqa``), whether the cache is MLA (K only), which
layers slide a window, and the recurrent state widths ``n_embd_r`` / ``n_embd_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from homelab.gguf.model import ModelInfo

# Architectures where every layer carries both an attention cache and a recurrent state.
BOTH_CACHES_ARCHS = frozenset({"falcon-h1"})


@dataclass(frozen=True)
class CacheGeometry:
    """Per-layer cache widths (in elements per token) that decide the KV and recurrent bytes."""

    n_layer: int  # every block in the file, multi-token-prediction layers included
    n_layer_trunk: int  # blocks the main graph runs (n_layer minus nextn layers)
    kv_layers: tuple[int, ...]  # layers owning a KV cache
    swa: tuple[bool, ...]  # per layer: uses the sliding window
    k_width: tuple[int, ...]  # per layer: head_dim_k x n_head_kv
    v_width: tuple[int, ...]  # per layer: head_dim_v x n_head_kv
    head_dims: tuple[int, ...]  # distinct K/V head sizes of the cached layers
    mla: bool  # multi-head latent attention: K only, no V tensor
    n_swa: int
    recurrent_layers: tuple[int, ...]
    r_width: int  # n_embd_r: convolution / token-shift state per sequence
    s_width: int  # n_embd_s: SSM / WKV state per sequence

    @property
    def v_width_max(self) -> int:
        return max(self.v_width, default=0)

    @property
    def has_swa(self) -> bool:
        return any(self.swa[layer] for layer in self.kv_layers)


def cache_geometry(model: ModelInfo) -> CacheGeometry:
    trunk = model.n_layer - int_key(model, "nextn_predict_layers")
    recurrent = tuple(il for il in range(trunk) if model.recurrent_layers[il])
    kv_layers = tuple(il for il in range(trunk) if _has_kv(model, il))
    mla = is_mla(model)
    k_width = tuple(head_dim_k(model, il) * model.n_head_kv[il] for il in range(model.n_layer))
    v_width = tuple(head_dim_v(model, il) * model.n_head_kv[il] for il in range(model.n_layer))
    dims = {head_dim_k(model, il) for il in kv_layers}
    if not mla:
        dims |= {head_dim_v(model, il) for il in kv_layers}
    return CacheGeometry(
        n_layer=model.n_layer,
        n_layer_trunk=trunk,
        kv_layers=kv_layers,
        swa=tuple(model.swa_layers) if model.n_swa > 0 else (False,) * model.n_layer,
        k_width=k_width,
        v_width=(0,) * model.n_layer if mla else v_width,
        head_dims=tuple(sorted(dims)),
        mla=mla,
        n_swa=model.n_swa,
        recurrent_layers=recurrent,
        r_width=recurrent_r_width(model) if recurrent else 0,
        s_width=recurrent_s_width(model) if recurrent else 0,
    )


def is_mla(model: ModelInfo) -> bool:
    """llama.cpp treats a model as MLA only when the file carries the *_mla head sizes."""
    return (
        int_key(model, "attention.key_length_mla") > 0
        and int_key(model, "attention.value_length_mla") > 0
    )


def head_dim_k(model: ModelInfo, layer: int) -> int:
    if model.n_swa > 0 and model.swa_layers[layer]:
        return int_key(model, "attention.key_length_swa") or model.head_dim_k
    return model.head_dim_k


def head_dim_v(model: ModelInfo, layer: int) -> int:
    if model.n_swa > 0 and model.swa_layers[layer]:
        return int_key(model, "attention.value_length_swa") or model.head_dim_v
    return model.head_dim_v


def _has_kv(model: ModelInfo, layer: int) -> bool:
    if model.architecture in BOTH_CACHES_ARCHS:
        return True
    return not model.recurrent_layers[layer]


def recurrent_r_width(model: ModelInfo) -> int:
    """``llama_hparams::n_embd_r`` for RWKV, LFM2 and Mamba-style layers."""
    if int_key(model, "wkv.head_size"):
        return (int_key(model, "token_shift_count") or 2) * model.n_embd
    l_cache = int_key(model, "shortconv.l_cache")
    if l_cache:
        return model.n_embd * (l_cache - 1)
    conv = max(model.ssm_d_conv - 1, 0)
    return conv * (model.ssm_d_inner + 2 * model.ssm_n_group * model.ssm_d_state)


def recurrent_s_width(model: ModelInfo) -> int:
    """``llama_hparams::n_embd_s``: the SSM (or WKV) state of one sequence in one layer."""
    wkv_head_size = int_key(model, "wkv.head_size")
    if wkv_head_size:
        return model.n_embd * wkv_head_size
    return model.ssm_d_state * model.ssm_d_inner


def int_key(model: ModelInfo, key: str) -> int:
    """An ``{arch}.{key}`` integer from the metadata, 0 when absent."""
    value: object = model.metadata.get(f"{model.architecture}.{key}", 0)
    if isinstance(value, tuple):
        value = value[0] if value else 0
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
