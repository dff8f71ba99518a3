"""A stand-in for the engine, so the server's validation tests run without loading a model.

Why it exists: most of what the server checks — JSON, parameter ranges, keys, routes, the
OpenAI error envelope, context arithmetic — is about HTTP and the wire format, not about a
model. Run against a real llama.cpp engine, the 60-case bad-request table pays for a model
load, a uvicorn thread, real sockets and a machine that can run llama.cpp; behind
``httpx.ASGITransport(create_app(...))`` with this fake it runs in about a second, in
process. (Only the JSON-schema cases still call llama-cpp-python's pure-Python schema
converter.) The real engine still answers the table's live subset
(tests/server/test_bad_requests.py) and every other server test, so the fake cannot drift
from the contract unnoticed.

It keeps the engine's contract where the server can see it (``EngineLike`` in
homelab/server/engine_seam.py): the demo model's vocabulary size and real chat template (the same
``ChatTemplate`` class the engine uses), a byte-level tokenizer (one token per UTF-8 byte,
after BOS) with the engine's own bounded ``tokenize_within``, and handles that yield
``TokenEvent`` items and then exactly one ``FinishEvent``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from homelab.engine.api import (
    EngineMetrics,
    FinishEvent,
    GenerationRequest,
    RequestStats,
    TokenEvent,
)
from homelab.engine.chat_template import ChatTemplate
from homelab.engine.prompt_bound import tokenize_within
from homelab.errors import ContextLengthError, EngineError
from homelab.gguf.model import ModelInfo
from homelab.gguf.vocab import BOS_ID, CHAT_TEMPLATE

FIRST_BYTE_ID = 8  # byte b is token FIRST_BYTE_ID + b (ids below are BOS, EOS...)
WORDS = ("cache", "token", "layer", "slot")


class FakeHandle:
    """Yields ``max_tokens`` words, then a ``length`` finish."""

    def __init__(self, request: GenerationRequest) -> None:
        self.request = request
        self.cancelled = False

    async def __aiter__(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        count = self.request.sampling.max_tokens
        for index in range(count):
            if self.cancelled:
                yield FinishEvent("cancelled", self._stats(index))
                return
            yield TokenEvent(f" {WORDS[index % len(WORDS)]}", FIRST_BYTE_ID + index % 200)
        yield FinishEvent("length", self._stats(count))

    def events(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        return self.__aiter__()

    async def all_events(self) -> list[TokenEvent | FinishEvent]:
        return [event async for event in self.__aiter__()]

    def has_queued(self) -> bool:
        return False  # each word is made when it is read

    def cancel(self) -> None:
        self.cancelled = True

    def _stats(self, completion_tokens: int) -> RequestStats:
        prompt_tokens = len(self.request.prompt)
        return RequestStats(
            prompt_tokens=prompt_tokens,
            cached_tokens=0,
            completion_tokens=completion_tokens,
            ttft_s=0.001,
            prefill_tok_s=1e6,
            decode_tok_s=1e6,
            queue_s=0.0,
            evaluated_tokens=prompt_tokens,
        )


class FakeEngine:
    """An ``EngineLike`` with the demo model's vocabulary size and chat template."""

    def __init__(self, model_info: ModelInfo, n_ctx_per_slot: int) -> None:
        self.model_info = model_info
        self.n_ctx_per_slot = n_ctx_per_slot
        self.chat_template = ChatTemplate(CHAT_TEMPLATE, "<s>", "</s>")
        self.longest_token_bytes = 1
        self.failure: str | None = None
        self.embedder = None  # no embeddings: /v1/embeddings answers 400
        self.image_marker: str | None = None  # no vision projector: images answer 400
        self.submitted: list[GenerationRequest] = []

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        body = [FIRST_BYTE_ID + byte for byte in text.encode()]
        return [BOS_ID, *body] if add_bos else body

    def tokenize_within(
        self, text: str, limit: int, add_bos: bool = True, special: bool = True
    ) -> list[int]:
        return tokenize_within(
            lambda piece, bos: self.tokenize(piece, bos),
            text,
            limit,
            add_bos=add_bos,
            longest_token_bytes=lambda: self.longest_token_bytes,
        )

    def detokenize(self, ids: Sequence[int]) -> str:
        body = bytes(i - FIRST_BYTE_ID for i in ids if FIRST_BYTE_ID <= i < FIRST_BYTE_ID + 256)
        return body.decode(errors="replace")

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> str:
        return self.chat_template.render(messages, tools=tools, add_generation_prompt=True)

    def submit(self, request: GenerationRequest) -> FakeHandle:
        prompt = request.prompt
        if isinstance(prompt, str) or not prompt:
            raise EngineError("the fake engine takes token ids (the server tokenizes)")
        if len(prompt) + request.sampling.max_tokens > self.n_ctx_per_slot:
            raise ContextLengthError("the prompt plus max_tokens does not fit a slot")
        self.submitted.append(request)
        return FakeHandle(request)

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(
            prefill_tok_s=0.0,
            decode_tok_s=0.0,
            active_slots=0,
            n_slots=4,
            queue_depth=0,
            kv_cells_used=0,
            kv_cells_total=4 * self.n_ctx_per_slot,
            requests_total=len(self.submitted),
            requests_by_status={},
            last_ttft_s=None,
        )
