"""A vision projector (an mmproj GGUF, ``general.architecture == "clip"``) read from its header.

What discovery, validation and the planner need, without loading it: the projector type, the
width of the embeddings it produces (it must equal the text model's ``n_embd``; llama.cpp's
mtmd refuses the pair otherwise), its weight bytes (the sum of its tensors, as for a text
model) and the most tokens one image can take. The output width is read the way vendored
``clip.cpp`` (``clip_n_mmproj_embd``) reads it: from one tensor's shape, which tensor
depending on the projector type; types not in :data:`OUTPUT_TENSOR` fall back to
``clip.vision.projection_dim`` and otherwise stay unknown (mtmd then checks at load).
Image tokens follow ``clip.cpp``'s hyperparameters: Gemma 3 a fixed
``(image_size / patch_size / n_merge)²``, the Qwen-VL mergers one token per
``(patch_size × n_merge)²`` pixels clamped to [8, 4096] (a custom maximum lowers it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from homelab.errors import ModelFileError
from homelab.gguf.header import RawHeader
from homelab.gguf.reader import file_type_label, read_header_file

CLIP_ARCH = "clip"
# projector type -> (the tensor whose shape gives the output width, the dimension: ggml ne)
OUTPUT_TENSOR: dict[str, tuple[str, int]] = {
    "gemma3": ("mm.input_projection.weight", 0),
    "gemma3nv": ("mm.input_projection.weight", 0),
    "gemma4v": ("mm.input_projection.weight", 1),
    "gemma4uv": ("mm.input_projection.weight", 1),
    "qwen2vl_merger": ("mm.2.bias", 0),
    "qwen2.5vl_merger": ("mm.2.bias", 0),
    "qwen3vl_merger": ("mm.2.bias", 0),  # times 1 + deepstack layers
    "ling3vl": ("mm.2.bias", 0),
    "exaone4_5": ("mm.2.bias", 0),
    "mlp": ("mm.2.weight", 1),
    "pixtral": ("mm.2.weight", 1),
    "lightonocr": ("mm.2.weight", 1),
    "lfm2": ("mm.2.weight", 1),
    "kimivl": ("mm.2.weight", 1),
    "mlp_norm": ("mm.3.bias", 0),
    "internvl": ("mm.3.weight", 1),
    "idefics3": ("mm.model.fc.weight", 1),
}
QWEN_MERGERS = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "ling3vl")
QWEN_TOKENS = (8, 4096)  # clip.cpp: set_limit_image_tokens(8, 4096)
DEFAULT_MERGE = {"gemma3": 4, "qwen2vl_merger": 2, "qwen2.5vl_merger": 2, "qwen3vl_merger": 2}


@dataclass(frozen=True)
class ProjectorInfo:
    """An mmproj file, as far as planning and matching it to a text model go."""

    path: str
    projector_type: str  # clip.projector_type (clip.vision.projector_type), as llama.cpp names it
    has_vision: bool
    n_embd_out: int | None  # the embedding width it feeds the text model (None: not known)
    weights_bytes: int  # sum of its tensors' bytes
    file_type: str  # "F16", "Q8_0"...
    image_size_px: int  # clip.vision.image_size
    patch_size_px: int  # clip.vision.patch_size
    n_merge: int  # patches merged per side into one token
    n_embd_vision: int = 0  # the vision tower's width, feed-forward width and heads
    n_ff_vision: int = 0
    n_head_vision: int = 0

    @property
    def fixed_image_tokens(self) -> int | None:
        """Tokens every image costs when the projector resizes all to one size (Gemma 3)."""
        if self.projector_type != "gemma3" or not self.patch_size_px:
            return None
        return (self.image_size_px // self.patch_size_px // max(1, self.n_merge)) ** 2

    def max_image_tokens(self, custom_max: int = 0) -> int | None:
        """The most tokens one image can take (``custom_max``: ``--image-max-tokens``, 0 the
        projector's own); None when this type's rule is not known here."""
        fixed = self.fixed_image_tokens
        if fixed is not None:
            return fixed
        if self.projector_type in QWEN_MERGERS:
            return custom_max if custom_max > 0 else QWEN_TOKENS[1]
        return custom_max or None


def read_projector(path: str | Path) -> ProjectorInfo:
    """The projector in ``path``; ModelFileError when it is not one."""
    file = Path(path).expanduser()
    return projector_from_header(read_header_file(file), str(file))


def projector_from_header(header: RawHeader, source: str) -> ProjectorInfo:
    """The projector a parsed header describes (a local file's or a remote one's)."""
    file = source
    meta = header.metadata
    arch = meta.get("general.architecture")
    if arch != CLIP_ARCH:
        raise ModelFileError(
            file,
            f"is not a vision projector (general.architecture is {arch!r}, not 'clip')",
            hint="Give --mmproj the mmproj-*.gguf file that comes with the model.",
        )
    kind = _text(meta, "clip.vision.projector_type") or _text(meta, "clip.projector_type")
    patch = _int(meta, "clip.vision.patch_size")
    merge = _merge(meta, kind)
    return ProjectorInfo(
        path=file,
        projector_type=kind,
        has_vision=bool(
            meta.get("clip.has_vision_encoder", not meta.get("clip.has_audio_encoder", False))
        ),
        n_embd_out=output_width(header, kind),
        weights_bytes=sum(t.n_bytes for t in header.tensors),
        file_type=file_type_label(meta.get("general.file_type")),
        image_size_px=_int(meta, "clip.vision.image_size"),
        patch_size_px=patch,
        n_merge=merge,
        n_embd_vision=_int(meta, "clip.vision.embedding_length"),
        n_ff_vision=_int(meta, "clip.vision.feed_forward_length"),
        n_head_vision=_int(meta, "clip.vision.attention.head_count"),
    )


def is_projector(path: str | Path) -> bool:
    """Whether ``path`` is a GGUF whose architecture is ``clip`` (False when unreadable)."""
    try:
        return read_header_file(Path(path).expanduser()).metadata.get("general.architecture") == (
            CLIP_ARCH
        )
    except ModelFileError:
        return False


def projector_summary(projector: ProjectorInfo) -> dict[str, object]:
    """What ``inspect`` and ``models`` show of a projector (JSON shapes)."""
    return {
        "path": projector.path,
        "projector_type": projector.projector_type,
        "file_type": projector.file_type,
        "weights_bytes": projector.weights_bytes,
        "n_embd_out": projector.n_embd_out,
        "image_max_tokens": projector.max_image_tokens(),
        "fixed_image_tokens": projector.fixed_image_tokens is not None,
    }


def describe_projector(projector: ProjectorInfo) -> str:
    """One line: ``mmproj-x-F16.gguf (gemma3, F16, 254.5 KiB; 256 tokens per image)``."""
    from homelab.units import format_size

    tokens = projector.max_image_tokens()
    if projector.fixed_image_tokens is not None:
        rule = f"{tokens} tokens per image"
    else:
        rule = f"up to {tokens} tokens per image" if tokens else "tokens per image: by size"
    return (
        f"{Path(projector.path).name} ({projector.projector_type}, {projector.file_type}, "
        f"{format_size(projector.weights_bytes)}; {rule})"
    )


def output_width(header: RawHeader, kind: str) -> int | None:
    """The width of the embeddings the projector produces (``clip_n_mmproj_embd``)."""
    shapes = {t.name: t.shape for t in header.tensors}
    name, dim = OUTPUT_TENSOR.get(kind, ("", 0))
    shape = shapes.get(name)
    if shape is not None and len(shape) > dim:
        width = int(shape[dim])
        return width * (1 + _deepstack_layers(shapes)) if kind == "qwen3vl_merger" else width
    declared = header.metadata.get("clip.vision.projection_dim")
    return int(declared) if isinstance(declared, int) and declared > 0 else None


def _deepstack_layers(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(1 for name in shapes if "deepstack" in name and name.endswith("fc2.weight"))


def _merge(meta: dict[str, object], kind: str) -> int:
    for key in ("clip.vision.spatial_merge_size", "clip.vision.projector.scale_factor"):
        value = meta.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MERGE.get(kind, 1)


def _text(meta: dict[str, object], key: str) -> str:
    value = meta.get(key)
    return value if isinstance(value, str) else ""


def _int(meta: dict[str, object], key: str) -> int:
    value = meta.get(key)
    return int(value) if isinstance(value, int) and value >= 0 else 0


def check_pair(projector: ProjectorInfo, n_embd: int, model_name: str) -> None:
    """The projector must feed embeddings as wide as the text model's (mtmd's own check)."""
    if not projector.has_vision:
        raise ModelFileError(
            projector.path,
            "this projector has no vision encoder (an audio-only mmproj)",
            hint="Use the model's image projector, or --no-mmproj.",
        )
    if projector.n_embd_out is not None and projector.n_embd_out != n_embd:
        raise ModelFileError(
            projector.path,
            f"this projector produces {projector.n_embd_out}-wide embeddings but {model_name} "
            f"takes {n_embd}: it belongs to another model",
            hint="Use the mmproj file from the same repo as the model, or --no-mmproj.",
        )
