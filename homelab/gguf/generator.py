"""Deterministic generator of small GGUF models with random weights that llama.cpp runs.

Each architecture is described by an :class:`ArchSpec` (hyperparameters) and a function that
lists its tensors by llama.cpp's names and shapes. Models are written in F16 with the
``gguf`` package (:func:`write_gguf`, atomically). The output head is given a larger scale than
the rest so greedy decoding has clear margins between the top tokens.

The names, the cache and the quantized variants are :mod:`homelab.gguf.demo`'s; the
special-purpose models are :mod:`homelab.gguf.demo_extra`'s. Both build on this module, which
imports neither.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

from homelab.errors import HomelabError
from homelab.gguf import vocab as v
from homelab.locations import ensure_dir

ARCHS = ("llama", "qwen3", "gemma3", "moe", "deepseek2", "mamba")
SIZES = ("tiny", "bench")
GENERATOR_VERSION = 2  # bump when generated files change, so caches regenerate


@dataclass(frozen=True)
class ArchSpec:
    arch: str  # llama.cpp architecture name written to the file
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    context_length: int = 8192
    n_expert: int = 0
    n_expert_used: int = 0
    n_swa: int = 0


TINY = ArchSpec("llama", n_vocab=1024, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=512)
BENCH = ArchSpec("llama", n_vocab=32000, n_embd=768, n_layer=12, n_head=12, n_head_kv=4, n_ff=2048)


def spec_for(arch: str, size: str) -> ArchSpec:
    if arch not in ARCHS:
        raise HomelabError(
            f"unknown demo architecture {arch!r}", hint=f"Choose one of {', '.join(ARCHS)}."
        )
    if size not in SIZES:
        raise HomelabError(f"unknown demo size {size!r}", hint=f"Choose one of {', '.join(SIZES)}.")
    base = TINY if size == "tiny" else BENCH
    if arch == "gemma3":
        return replace(base, arch="gemma3", n_layer=6 if size == "tiny" else 12, n_swa=128)
    if arch == "moe":
        return replace(base, n_expert=4, n_expert_used=2, n_ff=base.n_ff // 2)
    if arch == "deepseek2":
        return replace(base, arch="deepseek2", n_expert=4, n_expert_used=2)
    if arch == "mamba":
        return replace(base, arch="mamba", n_head=0, n_head_kv=0, n_ff=0)
    return replace(base, arch=arch)


Tensor = tuple[str, np.ndarray]


class Weights:
    """Seeded random tensors in numpy order (reverse of ggml's ne)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def matrix(self, *ne: int, scale: float = 0.02) -> np.ndarray:
        return (self.rng.standard_normal(tuple(reversed(ne)), dtype=np.float32) * scale).astype(
            np.float16
        )

    @staticmethod
    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)


def _dense_attention(s: ArchSpec, w: Weights, i: int, qk_norm: bool) -> Iterator[Tensor]:
    head = s.n_embd // s.n_head
    p = f"blk.{i}."
    yield p + "attn_norm.weight", w.ones(s.n_embd)
    yield p + "attn_q.weight", w.matrix(s.n_embd, head * s.n_head)
    yield p + "attn_k.weight", w.matrix(s.n_embd, head * s.n_head_kv)
    yield p + "attn_v.weight", w.matrix(s.n_embd, head * s.n_head_kv)
    yield p + "attn_output.weight", w.matrix(head * s.n_head, s.n_embd)
    if qk_norm:
        yield p + "attn_q_norm.weight", w.ones(head)
        yield p + "attn_k_norm.weight", w.ones(head)


def _ffn(s: ArchSpec, w: Weights, i: int) -> Iterator[Tensor]:
    p = f"blk.{i}."
    yield p + "ffn_norm.weight", w.ones(s.n_embd)
    yield p + "ffn_gate.weight", w.matrix(s.n_embd, s.n_ff)
    yield p + "ffn_up.weight", w.matrix(s.n_embd, s.n_ff)
    yield p + "ffn_down.weight", w.matrix(s.n_ff, s.n_embd)


def _experts(s: ArchSpec, w: Weights, i: int, n_ff: int) -> Iterator[Tensor]:
    p = f"blk.{i}."
    yield p + "ffn_norm.weight", w.ones(s.n_embd)
    yield p + "ffn_gate_inp.weight", w.matrix(s.n_embd, s.n_expert, scale=0.5).astype(np.float32)
    yield p + "ffn_gate_exps.weight", w.matrix(s.n_embd, n_ff, s.n_expert)
    yield p + "ffn_up_exps.weight", w.matrix(s.n_embd, n_ff, s.n_expert)
    yield p + "ffn_down_exps.weight", w.matrix(n_ff, s.n_embd, s.n_expert)


def _llama_layers(s: ArchSpec, w: Weights) -> Iterator[Tensor]:
    for i in range(s.n_layer):
        yield from _dense_attention(s, w, i, qk_norm=s.arch == "qwen3")
        yield from (_experts(s, w, i, s.n_ff) if s.n_expert else _ffn(s, w, i))


def _gemma3_layers(s: ArchSpec, w: Weights) -> Iterator[Tensor]:
    for i in range(s.n_layer):
        yield from _dense_attention(s, w, i, qk_norm=True)
        yield f"blk.{i}.post_attention_norm.weight", w.ones(s.n_embd)
        yield from _ffn(s, w, i)
        yield f"blk.{i}.post_ffw_norm.weight", w.ones(s.n_embd)


# MLA sizes for the deepseek2 demo (all multiples of 32 so quantized caches work)
MLA_KV_LORA_RANK, MLA_Q_LORA_RANK, MLA_ROPE_DIM, MLA_NOPE_DIM, MLA_V_DIM = 64, 64, 32, 32, 32


def _deepseek2_layers(s: ArchSpec, w: Weights) -> Iterator[Tensor]:
    k_mla = MLA_NOPE_DIM + MLA_ROPE_DIM
    for i in range(s.n_layer):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", w.ones(s.n_embd)
        yield p + "attn_q_a_norm.weight", w.ones(MLA_Q_LORA_RANK)
        yield p + "attn_kv_a_norm.weight", w.ones(MLA_KV_LORA_RANK)
        yield p + "attn_q_a.weight", w.matrix(s.n_embd, MLA_Q_LORA_RANK)
        yield p + "attn_q_b.weight", w.matrix(MLA_Q_LORA_RANK, s.n_head * k_mla)
        yield p + "attn_kv_a_mqa.weight", w.matrix(s.n_embd, MLA_KV_LORA_RANK + MLA_ROPE_DIM)
        yield p + "attn_k_b.weight", w.matrix(MLA_NOPE_DIM, MLA_KV_LORA_RANK, s.n_head)
        yield p + "attn_v_b.weight", w.matrix(MLA_KV_LORA_RANK, MLA_V_DIM, s.n_head)
        yield p + "attn_output.weight", w.matrix(s.n_head * MLA_V_DIM, s.n_embd)
        if i == 0:  # one leading dense layer, like DeepSeek's first_k_dense_replace
            yield from _ffn(s, w, i)
            continue
        yield from _experts(s, w, i, s.n_ff // 2)
        yield p + "ffn_gate_shexp.weight", w.matrix(s.n_embd, s.n_ff // 2)
        yield p + "ffn_up_shexp.weight", w.matrix(s.n_embd, s.n_ff // 2)
        yield p + "ffn_down_shexp.weight", w.matrix(s.n_ff // 2, s.n_embd)


# Mamba sizes derived from n_embd, like the reference configurations
def _mamba_dims(s: ArchSpec) -> tuple[int, int, int, int]:
    return 4, 2 * s.n_embd, 16, max(1, s.n_embd // 16)  # d_conv, d_inner, d_state, dt_rank


def _mamba_layers(s: ArchSpec, w: Weights) -> Iterator[Tensor]:
    d_conv, d_inner, d_state, dt_rank = _mamba_dims(s)
    for i in range(s.n_layer):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", w.ones(s.n_embd)
        yield p + "ssm_in.weight", w.matrix(s.n_embd, 2 * d_inner)
        yield p + "ssm_conv1d.weight", w.matrix(d_conv, d_inner, scale=0.2).astype(np.float32)
        yield p + "ssm_conv1d.bias", np.zeros(d_inner, dtype=np.float32)
        yield p + "ssm_x.weight", w.matrix(d_inner, dt_rank + 2 * d_state)
        yield p + "ssm_dt.weight", w.matrix(dt_rank, d_inner, scale=0.1).astype(np.float32)
        yield p + "ssm_dt.bias", np.full(d_inner, -2.0, dtype=np.float32)
        a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))
        yield p + "ssm_a", a
        yield p + "ssm_d", w.ones(d_inner)
        yield p + "ssm_out.weight", w.matrix(d_inner, s.n_embd)


LAYERS: dict[str, Callable[[ArchSpec, Weights], Iterator[Tensor]]] = {
    "llama": _llama_layers,
    "qwen3": _llama_layers,
    "gemma3": _gemma3_layers,
    "deepseek2": _deepseek2_layers,
    "mamba": _mamba_layers,
}


def random_tensors(s: ArchSpec, seed: int) -> Iterator[Tensor]:
    w = Weights(seed)
    yield (
        "token_embd.weight",
        w.matrix(s.n_embd, s.n_vocab, scale=0.5 if s.arch == "mamba" else 0.02),
    )
    yield from LAYERS[s.arch](s, w)
    yield "output_norm.weight", w.ones(s.n_embd)
    yield "output.weight", w.matrix(s.n_embd, s.n_vocab, scale=4.0 / np.sqrt(s.n_embd))


RANDOM_DESCRIPTION = "homelab demo model: RANDOM WEIGHTS, output is meaningless"


def write_hparams(
    writer: gguf.GGUFWriter, s: ArchSpec, name: str, description: str = RANDOM_DESCRIPTION
) -> None:
    a = s.arch
    writer.add_name(name)
    writer.add_description(description)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(s.context_length)
    writer.add_embedding_length(s.n_embd)
    writer.add_block_count(s.n_layer)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_head)
    if a != "deepseek2":  # MLA writes its own KV head layout
        writer.add_head_count_kv(s.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if s.n_head and a != "deepseek2":
        writer.add_rope_dimension_count(s.n_embd // s.n_head)
    if s.n_expert:
        writer.add_expert_count(s.n_expert)
        writer.add_expert_used_count(s.n_expert_used)
    if s.n_swa:
        writer.add_sliding_window(s.n_swa)
    if a == "deepseek2":
        _write_mla_hparams(writer, s)
    if a == "mamba":
        d_conv, d_inner, d_state, dt_rank = _mamba_dims(s)
        writer.add_ssm_conv_kernel(d_conv)
        writer.add_ssm_inner_size(d_inner)
        writer.add_ssm_state_size(d_state)
        writer.add_ssm_time_step_rank(dt_rank)


def _write_mla_hparams(writer: gguf.GGUFWriter, s: ArchSpec) -> None:
    writer.add_rope_dimension_count(MLA_ROPE_DIM)
    writer.add_q_lora_rank(MLA_Q_LORA_RANK)
    writer.add_kv_lora_rank(MLA_KV_LORA_RANK)
    # MLA layout as convert_hf_to_gguf writes it: one latent "head" of kv_lora_rank + rope
    writer.add_head_count_kv(1)
    writer.add_key_length(MLA_KV_LORA_RANK + MLA_ROPE_DIM)
    writer.add_value_length(MLA_KV_LORA_RANK)
    writer.add_key_length_mla(MLA_NOPE_DIM + MLA_ROPE_DIM)
    writer.add_value_length_mla(MLA_V_DIM)
    writer.add_leading_dense_block_count(1)
    writer.add_expert_feed_forward_length(s.n_ff // 2)
    writer.add_expert_shared_count(1)
    writer.add_expert_weights_scale(1.0)
    writer.add_expert_weights_norm(True)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)


def write_tokenizer(
    writer: gguf.GGUFWriter,
    n_vocab: int,
    vocabulary: v.Vocabulary | None = None,
    chat_template: str = v.CHAT_TEMPLATE,
) -> None:
    vocabulary = vocabulary or v.build_vocabulary(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(list(vocabulary.tokens))
    writer.add_token_scores(list(vocabulary.scores))
    writer.add_token_types(list(vocabulary.types))
    writer.add_bos_token_id(v.BOS_ID)
    writer.add_eos_token_id(v.EOS_ID)
    writer.add_unk_token_id(v.UNK_ID)
    writer.add_eot_token_id(v.IM_END_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(chat_template)


def write_f16_model(
    path: Path, arch: str, size: str = "tiny", seed: int = 0, *, split_max_tensors: int = 0
) -> Path:
    """Write the F16 demo model for ``arch``/``size`` to ``path`` (atomically).

    With ``split_max_tensors`` > 0 the model is written as a split set
    ``<stem>-0000N-of-0000M.gguf`` next to ``path`` (llama.cpp's own layout, metadata in the
    first part) and the first part's path is returned.
    """
    spec = spec_for(arch, size)
    name = f"homelab-demo-{arch}-{size}"
    return write_spec_model(path, spec, name, seed, split_max_tensors=split_max_tensors)


def write_spec_model(
    path: Path,
    spec: ArchSpec,
    name: str,
    seed: int = 0,
    *,
    split_max_tensors: int = 0,
    tensors: Iterable[Tensor] | None = None,
    vocabulary: v.Vocabulary | None = None,
    description: str | None = None,
) -> Path:
    """Write a model of any ``spec``: F16 random weights from ``seed`` (e.g. a larger one for
    GPU checks), or the given ``tensors`` and ``vocabulary`` (the trained demo model)."""

    def metadata(writer: gguf.GGUFWriter) -> None:
        write_hparams(writer, spec, name, description or RANDOM_DESCRIPTION)
        write_tokenizer(writer, spec.n_vocab, vocabulary)

    weights = random_tensors(spec, seed) if tensors is None else tensors
    return write_gguf(path, spec.arch, metadata, weights, split_max_tensors=split_max_tensors)


def write_gguf(
    path: Path,
    arch: str,
    metadata: Callable[[gguf.GGUFWriter], None],
    tensors: Iterable[Tensor],
    *,
    split_max_tensors: int = 0,
) -> Path:
    """Write a GGUF of ``arch`` with the keys ``metadata`` adds and ``tensors``, atomically:
    it is built in a staging folder next to ``path`` and moved in place when complete."""
    ensure_dir(path.parent)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".partial-") as staging_dir:
        staging = Path(staging_dir) / path.name
        writer = gguf.GGUFWriter(staging, arch, split_max_tensors=split_max_tensors)
        metadata(writer)
        for tensor_name, data in tensors:
            writer.add_tensor(tensor_name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        written = sorted(Path(staging_dir).iterdir())
        for part in written:
            os.replace(part, path.parent / part.name)
    return path.parent / written[0].name
