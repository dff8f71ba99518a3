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

:class:`ImagePrefill` encodes and decodes; :class:`ImageSteps` is the scheduler's image side
(a placed job's cached images, a step's image rows planned with its text and decoded after
the token batch); the prompt helpers at the end make and check an ``ImagePrompt``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from homelab.engine.image_prompt import ImagePrompt, ImageSpan, placeholder
from homelab.engine.job import AdmittedJob, JobImages
from homelab.engine.metrics import EngineMeter
from homelab.engine.slots import SlotTable
from homelab.errors import EngineError
from homelab.images.decoded import DecodedImage
from homelab.llamacpp.context import Context
from homelab.llamacpp.mtmd import Projector, PromptChunk, decode_embeddings

log = logging.getLogger("homelab.engine")

SPATIAL_SECTIONS = 3  # t, y, x move with pos0 on M-RoPE; the fourth stays 0


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


class ImageSteps:
    """The scheduler's image side: a placed job's cached images, a step's image rows planned
    with its text, and decoded after the token batch."""

    def __init__(
        self,
        prefill: ImagePrefill | None,
        slots: SlotTable,
        meter: EngineMeter,
        fail: Callable[[AdmittedJob, str], None],
    ) -> None:
        self._prefill = prefill  # None: the model has no vision projector
        self._slots = slots
        self._meter = meter
        self._fail = fail  # the scheduler's: ends the request with an error, clears its slot
        self.planned: list[tuple[AdmittedJob, ImageSpan, int]] = []  # for this step

    def admit(self, job: AdmittedJob, prompt: ImagePrompt) -> None:
        """Placed: a cached prefix holds whole images only; counts are KV cells (as mtmd
        counts tokens); no speculation (a draft cannot read the images)."""
        n_whole = prompt.whole_images_only(job.n_past)
        if n_whole < job.n_past and not self._slots.rollback(job.slot, n_whole):
            n_whole = 0
        job.n_past = job.prompt_pos = n_whole
        job.clock.cached_tokens = prompt.cells_before(n_whole)
        job.chain.accept_prompt(prompt.text_tokens)

    def plan(self, job: AdmittedJob, images: JobImages, budget: int) -> int:
        """Plan this step's rows of the image at the job's next position; the budget used."""
        assert self._prefill is not None
        span = images.prompt.image_at(job.prompt_pos)
        assert span is not None
        rows = self._prefill.rows_for(images, span, budget)
        self.planned.append((job, span, rows))
        return rows

    def decode_planned(self) -> None:
        """Decode the planned image rows (after the token batch: one decode each)."""
        steps, self.planned = self.planned, []
        assert self._prefill is not None
        for job, span, rows in steps:
            if job.released or job.images is None:
                continue  # finished meanwhile (failed in the token batch)
            try:
                whole = self._prefill.step(job.images, span, job.slot.seq_id, rows)
            except Exception as exc:
                log.exception("an image failed for request %s", job.handle.request_id)
                self._fail(job, str(exc))  # clears the slot: its cache may be half-written
                continue
            self._meter.record_step(time.perf_counter(), rows, 0)
            if whole:
                job.slot.tokens.extend(job.images.prompt.tokens[span.start : span.end])
                job.n_past += span.n_pos
                job.prompt_pos += span.n_pos
                job.clock.evaluated_tokens += span.n_tokens


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
