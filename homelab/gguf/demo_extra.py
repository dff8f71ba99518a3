"""Special-purpose demo models (random weights, from :mod:`homelab.gguf.generator`).

``demo:bert``
    An embedding model as llama.cpp loads BERT: arch ``bert``, non-causal attention, learned
    positions (512), an uncased WordPiece vocabulary (tokenizer model ``bert``; ``[CLS]`` text
    ``[SEP]``) and ``bert.pooling_type`` = mean. tiny: 256 wide, 4 layers; bench: BERT-base.
``demo:reasoning``
    The qwen3 demo model with :data:`~homelab.gguf.vocab.REASONING_CHAT_TEMPLATE` (the reply
    opens ``<think>\\n``; ``enable_thinking=false`` gives an empty ``<think>\\n\\n</think>\\n\\n``
    block) and ``<think>``/``</think>`` as the vocabulary's last two ids, user-defined tokens
    that tokenize as one token from plain text.
``demo:spec`` and ``demo:spec-draft``
    A speculative-decoding pair with one vocabulary. The target has :data:`SPEC_TARGET_LAYERS`
    layers; its layers from :data:`SPEC_DRAFT_LAYERS` on have their ``attn_output`` and
    ``ffn_down`` scaled by :data:`SPEC_LATE_SCALE`, so they nudge the residual stream rather
    than rewrite it. The draft is exactly the target's embedding, first layers, output norm
    and head (the same seeded tensors, byte for byte), so the target's greedy token usually
    equals the draft's. Both default to the bench width; ``:tiny`` gives the fast pair.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np

from homelab.errors import HomelabError
from homelab.gguf import generator as gen
from homelab.gguf import vocab as v
from homelab.gguf.generator import ArchSpec, Tensor

EXTRA_VERSION = 1  # bump when these generated files change, so caches regenerate

BERT_SIZES = {
    "tiny": ArchSpec("bert", 1024, 256, 4, 4, 4, 1024, context_length=512),
    "bench": ArchSpec("bert", 30522, 768, 12, 12, 12, 3072, context_length=512),
}
BERT_TOKEN_TYPES = 2  # sentence A / B embeddings; llama.cpp always uses A

SPEC_TARGET_LAYERS, SPEC_DRAFT_LAYERS = 12, 2
SPEC_LATE_SCALE = 0.01  # later layers write 100x less: ~90% greedy agreement (0.02: ~85%)
SPEC_VOCAB = {"tiny": 1024, "bench": 8192}  # smaller than 32000 so the head does not dominate

Writer = Callable[[Path], Path]


def recipe(name: str, size: str) -> tuple[str, Writer]:
    """(cache file stem, F16 writer) of the special model ``name`` at ``size``."""
    if size not in gen.SIZES:
        raise HomelabError(
            f"unknown demo size {size!r}", hint=f"Choose one of {', '.join(gen.SIZES)}."
        )
    writers: dict[str, Writer] = {
        "bert": lambda path: write_bert(path, size),
        "reasoning": lambda path: write_reasoning(path, size),
        "spec": lambda path: write_spec_pair_member(path, size, draft=False),
        "spec-draft": lambda path: write_spec_pair_member(path, size, draft=True),
    }
    if name not in writers:
        raise HomelabError(
            f"unknown demo model {name!r}", hint=f"Choose one of {', '.join(writers)}."
        )
    return f"homelab-demo-{name}-{size}-x{EXTRA_VERSION}", writers[name]


# --- embeddings: BERT ------------------------------------------------------------------------


def bert_spec(size: str) -> ArchSpec:
    return BERT_SIZES[size]


def _linear(w: gen.Weights, n_in: int, n_out: int, prefix: str) -> Iterator[Tensor]:
    yield prefix + ".weight", w.matrix(n_in, n_out)
    yield prefix + ".bias", np.zeros(n_out, dtype=np.float32)


def _layer_norm(n: int, prefix: str) -> Iterator[Tensor]:
    yield prefix + ".weight", np.ones(n, dtype=np.float32)
    yield prefix + ".bias", np.zeros(n, dtype=np.float32)


def _bert_tensors(s: ArchSpec, seed: int) -> Iterator[Tensor]:
    w = gen.Weights(seed)
    yield "token_embd.weight", w.matrix(s.n_embd, s.n_vocab, scale=0.5)
    # F32 like converted BERTs: llama.cpp adds its row to the F32 embeddings directly
    yield "token_types.weight", w.matrix(s.n_embd, BERT_TOKEN_TYPES).astype(np.float32)
    yield "position_embd.weight", w.matrix(s.n_embd, s.context_length)
    yield from _layer_norm(s.n_embd, "token_embd_norm")
    for i in range(s.n_layer):
        p = f"blk.{i}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            yield from _linear(w, s.n_embd, s.n_embd, p + part)
        yield from _layer_norm(s.n_embd, p + "attn_output_norm")
        yield from _linear(w, s.n_embd, s.n_ff, p + "ffn_up")
        yield from _linear(w, s.n_ff, s.n_embd, p + "ffn_down")
        yield from _layer_norm(s.n_embd, p + "layer_output_norm")


def _write_bert_metadata(writer: gguf.GGUFWriter, s: ArchSpec, name: str) -> None:
    writer.add_name(name)
    writer.add_description("homelab demo embedding model: RANDOM WEIGHTS, vectors are meaningless")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(s.context_length)
    writer.add_embedding_length(s.n_embd)
    writer.add_block_count(s.n_layer)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_head)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    vocabulary = v.build_wordpiece_vocabulary(s.n_vocab)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(list(vocabulary.tokens))
    writer.add_token_types(list(vocabulary.types))
    writer.add_token_type_count(BERT_TOKEN_TYPES)
    writer.add_bos_token_id(v.CLS_ID)  # llama.cpp opens a WordPiece text with BOS = [CLS]
    writer.add_sep_token_id(v.SEP_ID)
    writer.add_pad_token_id(v.PAD_ID)
    writer.add_unk_token_id(v.WP_UNK_ID)
    writer.add_mask_token_id(v.MASK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)


def write_bert(path: Path, size: str = "tiny", seed: int = 0) -> Path:
    s = bert_spec(size)
    return gen.write_gguf(
        path,
        s.arch,
        lambda writer: _write_bert_metadata(writer, s, f"homelab-demo-bert-{size}"),
        _bert_tensors(s, seed),
    )


# --- reasoning: qwen3 with a <think> template ------------------------------------------------

REASONING_TOKENS = (v.THINK_OPEN, v.THINK_CLOSE)


def reasoning_token_ids(n_vocab: int) -> tuple[int, int]:
    """Ids of ``<think>`` and ``</think>`` in the reasoning model's vocabulary."""
    return n_vocab - 2, n_vocab - 1


def write_reasoning(path: Path, size: str = "tiny", seed: int = 0) -> Path:
    s = gen.spec_for("qwen3", size)
    vocabulary = v.build_vocabulary(s.n_vocab, added=REASONING_TOKENS)

    def metadata(writer: gguf.GGUFWriter) -> None:
        gen.write_hparams(writer, s, f"homelab-demo-reasoning-{size}")
        gen.write_tokenizer(writer, s.n_vocab, vocabulary, v.REASONING_CHAT_TEMPLATE)

    return gen.write_gguf(path, s.arch, metadata, gen.random_tensors(s, seed))


# --- speculative decoding: a target and its own first layers as the draft --------------------


def spec_target_spec(size: str) -> ArchSpec:
    base = gen.spec_for("llama", size)
    return replace(base, n_vocab=SPEC_VOCAB[size], n_layer=SPEC_TARGET_LAYERS)


def spec_draft_spec(size: str) -> ArchSpec:
    return replace(spec_target_spec(size), n_layer=SPEC_DRAFT_LAYERS)


def _layer_index(tensor_name: str) -> int | None:
    parts = tensor_name.split(".")
    return int(parts[1]) if parts[0] == "blk" else None


def _spec_tensors(size: str, draft: bool, seed: int) -> Iterator[Tensor]:
    """The target's tensors (later layers scaled down), or the draft's subset of them."""
    for name, data in gen.random_tensors(spec_target_spec(size), seed):
        layer = _layer_index(name)
        if layer is None or layer < SPEC_DRAFT_LAYERS:
            yield name, data
        elif not draft:
            late_output = name.endswith(("attn_output.weight", "ffn_down.weight"))
            yield name, (data * SPEC_LATE_SCALE).astype(data.dtype) if late_output else data


def write_spec_pair_member(path: Path, size: str = "bench", *, draft: bool, seed: int = 0) -> Path:
    s = spec_draft_spec(size) if draft else spec_target_spec(size)
    name = f"homelab-demo-spec{'-draft' if draft else ''}-{size}"

    def metadata(writer: gguf.GGUFWriter) -> None:
        gen.write_hparams(writer, s, name)
        gen.write_tokenizer(writer, s.n_vocab)

    return gen.write_gguf(path, s.arch, metadata, _spec_tensors(size, draft, seed))
