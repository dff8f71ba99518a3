"""``POST /v1/embeddings``: one vector per input, from the served model's embeddings context.

The engine the route gets (through the same helper as chat) serves embeddings when it has an
``embedder``: an embedding model served alone (:class:`~homelab.engine.embeddings.
EmbeddingModelEngine`, pooling from the GGUF) or a causal model served with
``--embeddings mean|cls|last`` (:meth:`~homelab.engine.embeddings.Embedder.beside`). Inputs
are a string, a list of strings, a list of token ids or a list of those; each must fit the
embeddings context whole (OpenAI refuses, never truncates, an input that is too long).
Vectors are unit length; ``encoding_format: "base64"`` sends each as little-endian float32
bytes. ``dimensions`` is accepted only when it equals the model's width (no truncation).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import anyio.to_thread
import numpy as np
from pydantic import Field, WithJsonSchema, field_validator
from starlette.responses import JSONResponse, Response

from homelab.engine.api import RequestStats
from homelab.errors import ContextLengthError
from homelab.server.engine_seam import EmbedderLike
from homelab.server.errors import ApiError, invalid_request
from homelab.server.protocol import INT64_MAX, WireModel, is_token_id
from homelab.server.serving import RequestContext, check_model_name, check_token_ids

log = logging.getLogger("homelab.server")

MAX_INPUTS = 2048  # per request, as OpenAI's API allows
INLINE_INPUT_CHARS = 8192  # less text than this is tokenized on the event loop

InputJson = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_INPUTS},
            {"type": "array", "items": {"type": "integer"}, "minItems": 1},
            {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                "minItems": 1,
                "maxItems": MAX_INPUTS,
            },
        ]
    }
)


class EmbeddingRequest(WireModel):
    model: str
    input: Annotated[Any, InputJson]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=INT64_MAX)
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _inputs(cls, value: Any) -> list[str | tuple[int, ...]]:
        """Normalized to a list of inputs, each text or token ids; the count is checked
        before any item is looked at."""
        if isinstance(value, str):
            if not value:
                raise ValueError("input must not be an empty string")
            return [value]
        if not isinstance(value, list) or not value:
            raise ValueError(
                "input must be a non-empty string, a list of strings, a list of token ids "
                "or a list of lists of token ids"
            )
        if all(is_token_id(t) for t in value):
            return [tuple(value)]
        if len(value) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} inputs are allowed, got {len(value)}")
        if all(isinstance(item, str) for item in value):
            if not all(value):
                raise ValueError("input strings must not be empty")
            return list(value)
        if all(
            isinstance(item, list) and item and all(is_token_id(t) for t in item) for item in value
        ):
            return [tuple(item) for item in value]
        raise ValueError("input items must all be strings, or all be non-empty lists of token ids")

    def inputs(self) -> list[str | tuple[int, ...]]:
        return self.input if isinstance(self.input, list) else []


# --- the route ------------------------------------------------------------------------------


async def create_embeddings(ctx: RequestContext, req: EmbeddingRequest) -> Response:
    check_model_name(ctx.config, req.model)
    embedder = embedder_of(ctx, req.model)
    check_dimensions(embedder, req.dimensions)
    inputs = req.inputs()
    if ctx.config.log_prompts:
        log.info("embeddings input tenant=%s: %r", ctx.tenant.name, inputs)
    tokens = await _tokenized(embedder, inputs)
    vectors = await _embedded(embedder, tokens)
    prompt_tokens = sum(len(t) for t in tokens)
    _record(ctx, prompt_tokens)
    data = [
        {"object": "embedding", "index": index, "embedding": _encoded(vector, req)}
        for index, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return JSONResponse({"object": "list", "data": data, "model": req.model, "usage": usage})


async def embed_texts(
    ctx: RequestContext,
    model: str,
    texts: Sequence[str],
    dimensions: int | None,
    *,
    truncate: bool,
) -> tuple[list[np.ndarray], int]:
    """Unit vectors for ``texts`` and their prompt tokens, recorded like a request of this
    route (Ollama's ``/api/embed`` and ``/api/embeddings``); ``truncate``: an input longer
    than the model takes is cut at its end (Ollama's default), else refused."""
    embedder = embedder_of(ctx, model)
    check_dimensions(embedder, dimensions)
    if truncate:
        tokens = await _cut(embedder, list(texts))
    else:
        tokens = await _tokenized(embedder, list(texts))
    vectors = await _embedded(embedder, tokens)
    prompt_tokens = sum(len(t) for t in tokens)
    _record(ctx, prompt_tokens)
    return vectors, prompt_tokens


def check_dimensions(embedder: EmbedderLike, dimensions: int | None) -> None:
    if dimensions is not None and dimensions != embedder.n_embd:
        raise invalid_request(
            f"This model's embeddings have {embedder.n_embd} dimensions; other values of "
            f"'dimensions' are not supported (got {dimensions}).",
            param="dimensions",
        )


def embedder_of(ctx: RequestContext, model: str) -> EmbedderLike:
    embedder = ctx.engine.embedder
    if embedder is None:
        raise invalid_request(
            f"The model '{model}' does not serve embeddings. Serve an embedding model, or "
            "start the server with --embeddings mean to embed with this one.",
            param="model",
            code="embeddings_unavailable",
        )
    return embedder


async def _tokenized(
    embedder: EmbedderLike, inputs: Sequence[str | tuple[int, ...]]
) -> list[Sequence[int]]:
    def run() -> list[Sequence[int]]:
        return [_tokens(embedder, index, item) for index, item in enumerate(inputs)]

    chars = sum(len(item) for item in inputs if isinstance(item, str))
    return run() if chars <= INLINE_INPUT_CHARS else await anyio.to_thread.run_sync(run)


async def _cut(embedder: EmbedderLike, texts: list[str]) -> list[Sequence[int]]:
    def run() -> list[Sequence[int]]:
        cut = [embedder.tokenize_cut(text) for text in texts]
        if any(was_cut for _, was_cut in cut):
            log.info("embeddings: inputs cut to %d tokens (truncate)", embedder.max_input_tokens)
        return [tokens for tokens, _ in cut]

    chars = sum(len(text) for text in texts)
    return run() if chars <= INLINE_INPUT_CHARS else await anyio.to_thread.run_sync(run)


def _tokens(embedder: EmbedderLike, index: int, item: str | tuple[int, ...]) -> Sequence[int]:
    param = f"input[{index}]"
    if isinstance(item, str):
        try:
            return embedder.tokenize(item)
        except ContextLengthError as exc:
            raise _too_long(param, embedder, exc.message) from None
    if len(item) > embedder.max_input_tokens:
        raise _too_long(param, embedder, f"it has {len(item)} tokens")
    check_token_ids(item, embedder.n_vocab, param=param)
    return item


def _too_long(param: str, embedder: EmbedderLike, detail: str) -> ApiError:
    message = (
        f"An embedding input may have at most {embedder.max_input_tokens} tokens, but "
        f"{param} is longer ({detail}). Split it into shorter pieces."
    )
    return ApiError(400, message, param=param, code="context_length_exceeded")


async def _embedded(embedder: EmbedderLike, tokens: list[Sequence[int]]) -> list[np.ndarray]:
    """The vectors; a closed embedder (shutting down) and a full queue are 503s, mapped by
    the one error path (:func:`~homelab.server.errors.api_error_from`)."""
    return await anyio.to_thread.run_sync(embedder.embed, tokens)


def _encoded(vector: np.ndarray, req: EmbeddingRequest) -> list[float] | str:
    if req.encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def _record(ctx: RequestContext, prompt_tokens: int) -> None:
    """Into the same counters and request log as generation (no completion tokens)."""
    ctx.metrics.observe_generation(
        RequestStats(
            prompt_tokens=prompt_tokens,
            cached_tokens=0,
            completion_tokens=0,
            ttft_s=0.0,
            prefill_tok_s=0.0,
            decode_tok_s=0.0,
            queue_s=0.0,
            evaluated_tokens=prompt_tokens,
        )
    )
    ctx.usage.update(prompt_tokens=prompt_tokens, cached_tokens=0, completion_tokens=0)
