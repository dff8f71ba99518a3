"""Demo vision models: a random-weight text model and its vision projector (mmproj GGUF).

llama.cpp runs an image through a *projector* file (``clip`` architecture: a small vision
transformer plus a projection into the text model's embedding width) and decodes the result
into the text model like token embeddings. These generated pairs exercise that path with
real llama.cpp and mtmd code and nothing downloaded:

``demo:vision-gemma3``
    The gemma3 demo text model and a Gemma 3 projector (SigLIP-style tower, average pooling
    by :data:`GEMMA3_MERGE`): every image is resized to a square and costs a **fixed**
    :func:`fixed_image_tokens` tokens (Gemma 3 itself: 256).
``demo:vision-qwen2vl``
    A ``qwen2vl`` text model (M-RoPE: positions in four sections, see
    :data:`QWEN2VL_ROPE_SECTIONS`) and a Qwen2-VL projector (two-frame patch convolution,
    2x2 patch merger): the image keeps its aspect ratio and costs one token per
    ``(patch × 2)²`` pixels, clamped to Qwen2-VL's own [8, 4096] — so the count **depends on
    the image size**, and an image's positions advance by ``max(rows, columns)``, not by
    its token count.

Both pairs are tiny (a few MB, load in well under a second). Each lives in a folder of its
own in the demo cache, the projector named like llama.cpp's (``mmproj-<model>.gguf``)
beside the text model, so "the mmproj next to the model" finds exactly one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

from homelab.errors import HomelabError
from homelab.gguf import generator as gen
from homelab.gguf.generator import ArchSpec, Tensor
from homelab.locations import demo_models_dir

VISION_VERSION = 1  # bump when these generated files change, so caches regenerate
VISION_KINDS = ("gemma3", "qwen2vl")
QWEN2VL_ROPE_SECTIONS = (8, 12, 12, 0)  # sums to head_dim / 2 = 32 (Qwen2-VL: 16, 24, 24)
GEMMA3_MERGE = 2  # patches pooled per side into one token (Gemma 3: 4)
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class VisionSpec:
    """A projector's shape: the tower and how its patches become tokens."""

    projector: str  # clip.projector_type, as llama.cpp spells it
    image_size: int  # the square side a fixed-size projector resizes to (px)
    patch_size: int  # px per patch side
    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    n_merge: int  # patches merged per side into one token


VISION_SPECS = {
    "gemma3": VisionSpec("gemma3", 128, 8, 64, 2, 4, 128, GEMMA3_MERGE),
    "qwen2vl": VisionSpec("qwen2vl_merger", 224, 14, 64, 2, 2, 128, 2),
}


def fixed_image_tokens(kind: str) -> int | None:
    """Tokens every image costs with a fixed-size projector (None: it depends on the image)."""
    if kind != "gemma3":
        return None
    s = VISION_SPECS[kind]
    side = s.image_size // s.patch_size // s.n_merge
    return side * side


def text_spec(kind: str) -> ArchSpec:
    """The demo text model a projector of ``kind`` feeds (its width = the projector's output)."""
    _checked(kind)
    if kind == "gemma3":
        return gen.spec_for("gemma3", "tiny")
    return replace(gen.spec_for("llama", "tiny"), arch="qwen2vl")


def _checked(kind: str) -> str:
    if kind not in VISION_KINDS:
        raise HomelabError(
            f"unknown demo vision model {kind!r}", hint=f"Choose one of {', '.join(VISION_KINDS)}."
        )
    return kind


# --- where the files live ---------------------------------------------------------------


def model_stem(kind: str) -> str:
    return f"homelab-demo-vision-{_checked(kind)}-tiny"


def vision_folder(kind: str, directory: Path | None = None) -> Path:
    return (directory or demo_models_dir()) / f"{model_stem(kind)}-w{VISION_VERSION}"


def mmproj_path(kind: str, directory: Path | None = None) -> Path:
    """The projector of the demo vision model ``kind`` (generated with it on first use)."""
    folder = vision_folder(kind, directory)
    path = folder / f"mmproj-{model_stem(kind)}-F16.gguf"
    if not path.exists():
        write_mmproj(path, kind)
    return path


def text_model_path(kind: str, directory: Path | None = None) -> Path:
    """The text model of the demo vision model ``kind``, its projector written beside it."""
    folder = vision_folder(kind, directory)
    path = folder / f"{model_stem(kind)}-F16.gguf"
    if not path.exists():
        write_text_model(path, kind)
    mmproj_path(kind, directory)
    return path


# --- the text models ----------------------------------------------------------------------


def write_text_model(path: Path, kind: str, seed: int = 0) -> Path:
    spec = text_spec(kind)

    def metadata(writer: gguf.GGUFWriter) -> None:
        gen.write_hparams(writer, spec, model_stem(kind))
        if spec.arch == "qwen2vl":
            writer.add_rope_dimension_sections(list(QWEN2VL_ROPE_SECTIONS))
        gen.write_tokenizer(writer, spec.n_vocab)

    arch_tensors = spec if spec.arch != "qwen2vl" else replace(spec, arch="llama")
    return gen.write_gguf(path, spec.arch, metadata, gen.random_tensors(arch_tensors, seed))


# --- the projectors -----------------------------------------------------------------------


def _f32(data: np.ndarray) -> np.ndarray:
    return data.astype(np.float32)


def _linear(w: gen.Weights, n_in: int, n_out: int, name: str) -> Iterator[Tensor]:
    yield f"{name}.weight", w.matrix(n_in, n_out, scale=1.0 / np.sqrt(n_in))
    yield f"{name}.bias", np.zeros(n_out, dtype=np.float32)


def _norm(n: int, name: str) -> Iterator[Tensor]:
    yield f"{name}.weight", np.ones(n, dtype=np.float32)
    yield f"{name}.bias", np.zeros(n, dtype=np.float32)


def _tower_layers(s: VisionSpec, w: gen.Weights) -> Iterator[Tensor]:
    for i in range(s.n_layer):
        p = f"v.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            yield from _linear(w, s.n_embd, s.n_embd, f"{p}.{part}")
        yield from _norm(s.n_embd, f"{p}.ln1")
        yield from _norm(s.n_embd, f"{p}.ln2")
        yield from _linear(w, s.n_embd, s.n_ff, f"{p}.ffn_up")
        yield from _linear(w, s.n_ff, s.n_embd, f"{p}.ffn_down")


def _patch_kernel(s: VisionSpec, w: gen.Weights) -> np.ndarray:
    return w.matrix(s.patch_size, s.patch_size, 3, s.n_embd, scale=0.05)


def _gemma3_tensors(s: VisionSpec, n_embd_text: int, seed: int) -> Iterator[Tensor]:
    w = gen.Weights(seed)
    n_patches = (s.image_size // s.patch_size) ** 2
    yield "v.patch_embd.weight", _patch_kernel(s, w)
    yield "v.patch_embd.bias", np.zeros(s.n_embd, dtype=np.float32)
    yield "v.position_embd.weight", _f32(w.matrix(s.n_embd, n_patches))
    yield from _tower_layers(s, w)
    yield from _norm(s.n_embd, "v.post_ln")
    yield "mm.soft_emb_norm.weight", np.ones(s.n_embd, dtype=np.float32)
    yield "mm.input_projection.weight", w.matrix(n_embd_text, s.n_embd, scale=0.05)


def _qwen2vl_tensors(s: VisionSpec, n_embd_text: int, seed: int) -> Iterator[Tensor]:
    w = gen.Weights(seed)
    merged = s.n_embd * s.n_merge * s.n_merge
    yield "v.patch_embd.weight", _patch_kernel(s, w)
    yield "v.patch_embd.weight.1", _patch_kernel(s, w)
    yield from _tower_layers(s, w)
    yield from _linear(w, merged, merged, "mm.0")
    yield from _linear(w, merged, n_embd_text, "mm.2")


def _write_clip_metadata(writer: gguf.GGUFWriter, s: VisionSpec, kind: str, n_out: int) -> None:
    writer.add_name(f"mmproj-{model_stem(kind)}")
    writer.add_description("homelab demo vision projector: RANDOM WEIGHTS, sees nothing")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_string("clip.projector_type", s.projector)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.embedding_length", s.n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", s.n_ff)
    writer.add_uint32("clip.vision.block_count", s.n_layer)
    writer.add_uint32("clip.vision.projection_dim", n_out)
    writer.add_uint32("clip.vision.attention.head_count", s.n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.image_size", s.image_size)
    writer.add_uint32("clip.vision.patch_size", s.patch_size)
    writer.add_array("clip.vision.image_mean", list(IMAGE_MEAN))
    writer.add_array("clip.vision.image_std", list(IMAGE_STD))
    if s.projector == "gemma3":
        writer.add_uint32("clip.vision.projector.scale_factor", s.n_merge)
    else:
        writer.add_uint32("clip.vision.spatial_merge_size", s.n_merge)


def write_mmproj(path: Path, kind: str, seed: int = 1) -> Path:
    """Write the projector for ``kind``: its output width is the text model's ``n_embd``."""
    s = VISION_SPECS[_checked(kind)]
    n_out = text_spec(kind).n_embd
    tensors = (_gemma3_tensors if kind == "gemma3" else _qwen2vl_tensors)(s, n_out, seed)
    return gen.write_gguf(
        path, "clip", lambda writer: _write_clip_metadata(writer, s, kind, n_out), tensors
    )
