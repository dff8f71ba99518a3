"""The typed, frozen description of a GGUF model that every other part plans from.

Built by :mod:`homelab.gguf.reader` from a local file (or split set) or from a byte stream
(remote headers). Sizes are ``int`` bytes; per-layer quantities are tuples indexed by layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MetadataValue = str | int | float | bool | tuple[object, ...]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the GGUF header describes it."""

    name: str
    ggml_type: int  # ggml type id (gguf.GGMLQuantizationType value)
    type_name: str  # e.g. "F16", "Q4_K"
    shape: tuple[int, ...]  # GGUF order: ne[0] (row length) first
    n_bytes: int  # exact size of the tensor's data
    offset: int  # offset of the data from the start of the data section

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def layer(self) -> int | None:
        """The block index for ``blk.N.*`` tensors, else None."""
        if not self.name.startswith("blk."):
            return None
        part = self.name.split(".", 2)[1]
        return int(part) if part.isdigit() else None

    @property
    def is_expert(self) -> bool:
        """MoE expert weights (``blk.N.ffn_{gate,up,down}_exps`` and fused variants)."""
        return "_exps" in self.name


@dataclass(frozen=True)
class ModelInfo:
    """What planning and loading need to know about a model, read from its GGUF header(s)."""

    source: str  # path of the first file, or a URL / repo reference
    architecture: str  # general.architecture, e.g. "llama", "qwen3", "deepseek2"
    name: str  # general.name or the file stem
    file_type: str  # weight quant label from general.file_type, e.g. "Q4_K_M", or "unknown"
    file_bytes: int  # total bytes of all files of the set
    n_files: int  # 1, or the number of parts of a split set
    n_params: int  # sum of tensor element counts
    context_length: int  # trained context ({arch}.context_length)
    n_layer: int  # {arch}.block_count
    n_embd: int  # {arch}.embedding_length
    n_ff: int  # {arch}.feed_forward_length (first layer when per-layer)
    n_vocab: int  # tokenizer vocabulary size (or {arch}.vocab_size)
    n_head: tuple[int, ...]  # attention heads per layer
    n_head_kv: tuple[int, ...]  # KV heads per layer (0 for layers without attention)
    head_dim_k: int  # {arch}.attention.key_length, default n_embd / n_head
    head_dim_v: int  # {arch}.attention.value_length, default n_embd / n_head
    n_swa: int  # sliding-window size in tokens; 0 when the model has none
    swa_layers: tuple[bool, ...]  # True for layers using the sliding window
    kv_lora_rank: int  # MLA compressed KV width (0 when not MLA)
    n_rot: int  # {arch}.rope.dimension_count (MLA rope part width)
    n_expert: int  # routed experts (0 for dense)
    n_expert_used: int
    n_expert_shared: int
    recurrent_layers: tuple[bool, ...]  # True for recurrent (SSM/RWKV) layers
    ssm_d_conv: int
    ssm_d_inner: int
    ssm_d_state: int
    ssm_n_group: int
    chat_template: str | None
    tokenizer_model: str  # tokenizer.ggml.model, e.g. "llama", "gpt2"
    bos_token_id: int | None
    eos_token_id: int | None
    tensors: tuple[TensorInfo, ...]
    metadata: Mapping[str, MetadataValue] = field(repr=False)  # every scalar key; arrays summarised

    @property
    def weights_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_recurrent(self) -> bool:
        return any(self.recurrent_layers)

    @property
    def has_swa(self) -> bool:
        return self.n_swa > 0 and any(self.swa_layers)

    def layer_tensors(self, layer: int) -> tuple[TensorInfo, ...]:
        return tuple(t for t in self.tensors if t.layer == layer)
