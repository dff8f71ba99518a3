"""The images of prompts being read: encoded on the compute lane, decoded in bounded pieces.

When a prefilling request reaches an image (see ``image_prompt``), the scheduler gives that
step's prefill budget to it instead of to text: the projector encodes the image once (on the
lane, like every llama.cpp compute), and its embeddings are decoded into the request's
sequence as a ``llama_decode`` of their own — a batch holds token ids or embeddings, never
both — at most ``budget`` rows a step, so the other sequences wait no longer for an image
than for a text prefill of as many tokens. Two things cannot be split: the encode itself, and
an image the model reads with a non-causal mask (Gemma 3): its rows must all be in one
ubatch, so it is decoded whole (``Engine.submit`` refuses one larger than ``n_ubatch``).

Positions come from mtmd: ``pos0 + i`` on most models; on M-RoPE models (Qwen2-VL) four per
row, (t, y, x, 0) from the image's first position, and the image advances the sequence by
``max(rows, columns)`` positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homelab.engine.image_prompt import ImagePrompt, ImageSpan, placeholder
from homelab.errors import EngineError
from homelab.images.decoded import DecodedImage
from homelab.llamacpp.context import Context
from homelab.llamacpp.mtmd import EncodedImage, Projector, PromptChunk, decode_embeddings

SPATIAL_SECTIONS = 3  # t, y, x move with pos0 on M-RoPE; the fourth stays 0


@dataclass(eq=False)
class JobImages:
    """A request's images and how far the one being read has got."""

    prompt: ImagePrompt
    encoded: EncodedImage | None = None
    rows_done: int = 0
    encode_s: float = 0.0  # time the projector spent on this request's images

    def reset(self) -> None:
        self.encoded = None
        self.rows_done = 0


class ImagePrefill:
    """Encodes images and decodes their embeddings into the engine's context."""

    def __init__(self, context: Context, projector: Projector) -> None:
        self._context = context
        self.projector = projector

    def rows_for(self, state: JobImages, span: ImageSpan, budget: int) -> int:
        """Rows of ``span`` to decode in a step with ``budget`` prefill tokens left."""
        remaining = span.n_tokens - state.rows_done
        if self.projector.non_causal:
            return remaining  # the whole image attends to itself: one decode
        return min(remaining, max(1, budget))

    def step(self, state: JobImages, span: ImageSpan, seq_id: int, rows: int) -> bool:
        """Decode the next ``rows`` rows of ``span`` into ``seq_id``; True once the image is
        whole in the cache. Raises EngineError when llama.cpp fails (the caller rolls back)."""
        if state.encoded is None:
            state.encoded = self.projector.encode(span.image)
            state.encode_s += state.encoded.encode_s
        encoded = state.encoded
        first, last = state.rows_done, state.rows_done + rows
        positions = encoded.relative_positions[:, first:last].copy()
        positions[:SPATIAL_SECTIONS] += span.start
        status = decode_embeddings(
            self._context,
            encoded.embeddings[first:last],
            positions,
            seq_id,
            non_causal=self.projector.non_causal,
        )
        if status != 0:
            state.reset()
            raise EngineError(f"llama.cpp failed to decode an image (status {status})")
        state.rows_done = last
        if last < span.n_tokens:
            return False
        state.reset()
        return True


# --- prompts -------------------------------------------------------------------------------


def image_prompt(chunks: Sequence[PromptChunk], images: Sequence[DecodedImage]) -> ImagePrompt:
    """The engine's form of mtmd's chunks: text ids, each image as its placeholder run."""
    tokens: list[int] = []
    spans: list[ImageSpan] = []
    for chunk in chunks:
        if chunk.image_index < 0:
            tokens.extend(chunk.tokens)
            continue
        image = images[chunk.image_index]
        spans.append(ImageSpan(image, len(tokens), chunk.n_pos, chunk.n_tokens))
        tokens.extend([placeholder(image.digest)] * chunk.n_pos)
    return ImagePrompt(tuple(tokens), tuple(spans))


def check_image_prompt(prompt: ImagePrompt, *, non_causal: bool, n_ubatch: int) -> None:
    """Refuse (EngineError) what the scheduler cannot read: a prompt that ends with an image
    (the first token is sampled after text), or a bidirectional image beyond one ubatch."""
    if prompt.images and prompt.images[-1].end == len(prompt.tokens):
        raise EngineError(
            "the prompt ends with an image", hint="Put some text (or the chat template) after it."
        )
    largest = max((span.n_tokens for span in prompt.images), default=0)
    if non_causal and largest > n_ubatch:
        raise EngineError(
            f"an image of {largest} tokens does not fit in one batch of {n_ubatch} "
            "(this model reads an image all at once)",
            hint="Load the model with a larger n_ubatch, or send a smaller image.",
        )
