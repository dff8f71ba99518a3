"""The engine as the server sees it: typed protocols, no ``getattr``.

The server never imports the engine's classes to call them; it talks to whatever it was
given through these protocols, which :class:`homelab.engine.engine.Engine` (a generative
model) and :class:`homelab.engine.embeddings.EmbeddingModelEngine` (an embedding model
served alone) both satisfy, and so does the tests' stand-in (``tests/server/fake_engine.py``).
mypy checks the real engines against them where ``homelab serve`` hands them over.

A closed engine raises :class:`~homelab.errors.EngineClosedError` from ``submit`` and
``embed``; :func:`homelab.server.errors.api_error_from` turns it into a 503.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from homelab.engine.api import EngineMetrics, FinishEvent, GenerationRequest, TokenEvent
from homelab.engine.image_prompt import ImagePrompt
from homelab.engine.loader import LoadReport
from homelab.gguf.model import ModelInfo
from homelab.images.decoded import DecodedImage

Event = TokenEvent | FinishEvent


class HandleLike(Protocol):
    """One submitted request: its events, and a way to stop it."""

    def events(self) -> AsyncIterator[Event]: ...
    async def all_events(self) -> list[Event]: ...
    def has_queued(self) -> bool: ...
    def cancel(self) -> None: ...


class TemplateLike(Protocol):
    """A model's chat template (``homelab.engine.chat_template.ChatTemplate``)."""

    source: str  # the Jinja text: what reasoning style and tool syntax the model uses

    @property
    def supports_tools(self) -> bool: ...
    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str: ...


class EmbedderLike(Protocol):
    """What ``/v1/embeddings`` uses (``homelab.engine.embeddings.Embedder``)."""

    @property
    def n_embd(self) -> int: ...
    @property
    def max_input_tokens(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    def tokenize(self, text: str) -> list[int]: ...
    def tokenize_cut(self, text: str) -> tuple[list[int], bool]: ...
    def embed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]: ...


class EngineLike(Protocol):
    """The part of an engine the server uses."""

    @property
    def model_info(self) -> ModelInfo: ...
    @property
    def n_ctx_per_slot(self) -> int: ...
    @property
    def chat_template(self) -> TemplateLike | None: ...
    @property
    def longest_token_bytes(self) -> int | None: ...
    @property
    def failure(self) -> str | None:
        """Why the engine can serve nothing more (a lost RPC worker), or None."""

    @property
    def embedder(self) -> EmbedderLike | None: ...
    def submit(self, request: GenerationRequest) -> HandleLike: ...
    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> Sequence[int]: ...
    def tokenize_within(
        self, text: str, limit: int, add_bos: bool = True, special: bool = True
    ) -> Sequence[int]: ...
    def detokenize(self, ids: Sequence[int]) -> str: ...
    def metrics(self) -> EngineMetrics: ...
    @property
    def image_marker(self) -> str | None:
        """What stands for an image in a prompt (None: the model takes no images)."""

    def tokenize_images(
        self, text: str, images: Sequence[DecodedImage], add_bos: bool = True
    ) -> ImagePrompt: ...


@runtime_checkable
class LoadedEngine(EngineLike, Protocol):
    """An engine the server loaded itself (the fleet's): what llama.cpp allocated, and
    closing it."""

    @property
    def load_report(self) -> LoadReport: ...
    def close(self) -> None: ...
