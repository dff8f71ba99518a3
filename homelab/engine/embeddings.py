"""Embeddings on their own llama.cpp context, so generation's slots and caches are untouched.

    embedder = Embedder.load(path)                       # an embedding model (BERT…)
    embedder = Embedder.beside(engine, EmbeddingOptions(pooling="mean"))  # a causal model
    vectors = embedder.embed([embedder.tokenize("hello"), embedder.tokenize("world")])

An :class:`Embedder` owns one :class:`~homelab.llamacpp.embeddings.EmbeddingContext` and runs
every llama.cpp call on one thread: its own worker for a model loaded alone, or — beside a
generation :class:`~homelab.engine.engine.Engine` on the same ``llama_model`` — the engine's
scheduler thread, between two decode steps (the engine's rule: one thread computes, or
OpenMP teams fight). A request's inputs are packed into decodes of whole sequences, at most
``n_seq`` sequences and ``max_input_tokens`` tokens each (llama.cpp pools per ubatch, so a
sequence never spans two): the work one call adds between two generation steps is bounded
like a prefill chunk. Each decode starts from an empty cache, so nothing of one request (or
tenant) is visible to another. Vectors are L2-normalised, like OpenAI's.

:class:`EmbeddingModelEngine` serves an embedding model on its own: the server's engine
surface with generation refused (such a model has no language-model head worth sampling).
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from homelab.engine.api import EngineMetrics
from homelab.engine.loader import (
    BufferSizes,
    LadderStep,
    LoadReport,
    default_threads,
    parse_buffers,
)
from homelab.engine.prompt_bound import tokenize_within
from homelab.errors import BusyError, ContextLengthError, EngineClosedError, EngineError
from homelab.gguf.model import ModelInfo
from homelab.llamacpp._lib import Closing
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import ContextCreateError
from homelab.llamacpp.embeddings import CALLER_POOLINGS, EmbeddingContext, EmbeddingParams
from homelab.llamacpp.model import Model, ModelLoadError, ModelParams
from homelab.settings import Settings

if TYPE_CHECKING:
    import numpy as np

    from homelab.llamacpp.context import Context

T = TypeVar("T")
Runner = Callable[[Callable[[], T]], "concurrent.futures.Future[T]"]

# Encoder-only architectures llama.cpp knows (no language-model head to generate with).
ENCODER_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert"}
    | {"modern-bert", "eurobert", "t5encoder"}
)
DEFAULT_MAX_INPUT_TOKENS = 2048
DEFAULT_SEQUENCES = 8
DEFAULT_MAX_INPUTS = 2048  # per request, as OpenAI's API allows
NORMALISED_TOKEN_CHARS = 64  # the text kept per token where a vocabulary normalises (a guess)
DEFAULT_MAX_WAITING = 16  # requests queued for the context before new ones get BusyError


@dataclass(frozen=True)
class EmbeddingOptions:
    """How an embedder is set up (the defaults suit an embedding model served alone)."""

    pooling: str | None = None  # None: the model's own; "mean", "cls" or "last" for a causal one
    max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS  # also capped by the trained context
    n_seq: int = DEFAULT_SEQUENCES  # sequences per decode
    max_inputs: int = DEFAULT_MAX_INPUTS
    max_waiting: int = DEFAULT_MAX_WAITING
    n_threads: int | None = None

    def checked(self) -> EmbeddingOptions:
        if self.pooling is not None and self.pooling not in CALLER_POOLINGS:
            raise EngineError(
                f"unknown pooling {self.pooling!r} for embeddings",
                hint=f"Choose one of {', '.join(CALLER_POOLINGS)}.",
            )
        if self.max_input_tokens < 1 or self.n_seq < 1 or self.max_inputs < 1:
            raise EngineError("embedding limits must be at least 1")
        return self


def is_embedding_model(info: ModelInfo) -> bool:
    """An embedding model: an encoder architecture, or a GGUF that names a pooling (mean,
    CLS, last — e.g. Qwen3-Embedding is a causal qwen3 with last-token pooling)."""
    pooling = info.metadata.get(f"{info.architecture}.pooling_type")
    named = isinstance(pooling, int) and pooling in (1, 2, 3)
    return info.architecture in ENCODER_ARCHITECTURES or named


def embedding_params(options: EmbeddingOptions, n_ctx_train: int) -> EmbeddingParams:
    """The context for ``options``: one decode holds the longest input allowed."""
    longest = options.max_input_tokens
    if n_ctx_train > 0:
        longest = min(longest, n_ctx_train)
    return EmbeddingParams(
        n_ctx=longest,
        n_batch=longest,
        n_seq_max=options.n_seq,
        pooling=options.pooling,
        n_threads=options.n_threads,
    )


class _EngineWithModel(Protocol):
    """What :meth:`Embedder.beside` needs of a generation engine."""

    embedder: Any

    @property
    def context(self) -> Context: ...
    def run_on_engine_thread(self, function: Callable[[], T]) -> concurrent.futures.Future[T]: ...


class Embedder(Closing):
    """Pooled, normalised vectors for token sequences; safe to call from any thread."""

    def __init__(
        self,
        context: EmbeddingContext,
        options: EmbeddingOptions,
        run: Runner[Any] | None = None,
        owned_model: Model | None = None,
    ) -> None:
        self._context = context
        self.options = options
        self.pooling = context.pooling
        if self.pooling not in ("mean", "cls", "last"):
            raise EngineError(
                f"this model's embeddings context pools with '{self.pooling}', "
                "which gives no vector per text",
                hint="Name a pooling for it: mean, cls or last (homelab serve --embeddings).",
            )
        self.n_embd = context.n_embd
        self.max_input_tokens = min(context.n_batch, context.n_ctx_per_seq)
        self.vocab = context.model.vocab
        self.model_path = context.model.path
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        if run is None:
            self._worker = worker = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="homelab-embed"
            )
            run = worker.submit
        self._run: Runner[Any] = run
        self._owned_model = owned_model
        self._batch = Batch(context.n_batch)
        self._waiting = 0
        self._lock = threading.Lock()
        self._closed = False
        self.buffers: BufferSizes = parse_buffers(context.creation_log)

    # --- construction ------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        path: str | Path,
        options: EmbeddingOptions | None = None,
        *,
        n_gpu_layers: int = -1,
        run: Runner[Any] | None = None,
    ) -> Embedder:
        """Load an embedding model on its own, with its own compute thread (or ``run``: a
        function that runs a callable on the thread that may compute, returning a future)."""
        options = (options or EmbeddingOptions()).checked()
        path = Path(path).expanduser()
        try:
            model = Model.load(path, ModelParams(n_gpu_layers=n_gpu_layers))
        except ModelLoadError as failure:
            raise EngineError(
                f"llama.cpp could not load the embedding model {path}: {failure.reason}",
                hint="Check that the file is a complete GGUF llama.cpp can run.",
            ) from None
        try:
            context = _create(model, embedding_params(options, _n_ctx_train(model)))
        except BaseException:
            model.close()
            raise
        try:
            return cls(context, options, run=run, owned_model=model)
        except BaseException:
            context.close()
            model.close()
            raise

    @classmethod
    def beside(cls, engine: _EngineWithModel, options: EmbeddingOptions) -> Embedder:
        """An embedder on ``engine``'s model (no second copy of the weights), computing on
        the engine's thread. The engine closes it (``engine.embedder``) before its model."""
        options = options.checked()
        if options.n_threads is None:  # compute like the engine it shares a thread with
            options = replace(options, n_threads=engine.context.params.n_threads)
        model = engine.context.model
        params = embedding_params(options, _n_ctx_train(model))
        context = engine.run_on_engine_thread(lambda: _create(model, params)).result()
        try:
            embedder = cls(context, options, run=engine.run_on_engine_thread)
        except BaseException:
            context.close()
            raise
        engine.embedder = embedder
        return embedder

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_tokens

    # --- text ----------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """An input's tokens with the model's own framing (BOS, or BERT's [CLS] … [SEP]);
        refused (ContextLengthError) past ``max_input_tokens`` after bounded work."""
        if self._closed:  # the vocabulary may be gone with the model
            raise EngineClosedError("the embeddings context is closed")
        return tokenize_within(
            lambda piece, bos: self.vocab.tokenize(piece, add_bos=bos, parse_special=False),
            text,
            self.max_input_tokens,
            add_bos=True,
            longest_token_bytes=lambda: self.longest_token_bytes,
        )

    @functools.cached_property
    def longest_token_bytes(self) -> int | None:
        """The most bytes of text one token stands for (None: the vocabulary normalises)."""
        return self.vocab.longest_token_bytes()

    def tokenize_cut(self, text: str) -> tuple[list[int], bool]:
        """An input's tokens cut at its end to ``max_input_tokens``, the framing kept
        (Ollama's ``truncate``), and whether it was cut. Bounded work: only the head of the
        text that can still be kept is tokenized."""
        if self._closed:
            raise EngineClosedError("the embeddings context is closed")
        limit = self.max_input_tokens
        per_token = self.longest_token_bytes or NORMALISED_TOKEN_CHARS
        # a character is at least a byte, a token at most per_token bytes: this head still
        # has at least `limit` tokens when the text has
        head = text[: limit * per_token]
        tokens = self.vocab.tokenize(head, add_bos=True, parse_special=False)
        if len(tokens) <= limit:
            return tokens, len(head) < len(text)
        tail = max(0, len(self.vocab.tokenize("", add_bos=True, parse_special=False)) - 1)
        return tokens[: limit - tail] + tokens[len(tokens) - tail :], True

    # --- vectors -------------------------------------------------------------------------

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One unit-length vector per input (blocking; call it from a worker thread)."""
        self._check(inputs)
        with self._admitted():
            vectors: list[np.ndarray] = []
            for group in self._groups(inputs):
                future = self._submit(functools.partial(self._decode, group))
                try:
                    vectors += future.result()
                except concurrent.futures.CancelledError:
                    raise EngineClosedError("the embeddings context was closed") from None
            return vectors

    def _check(self, inputs: Sequence[Sequence[int]]) -> None:
        if not inputs:
            raise EngineError("no inputs to embed")
        if len(inputs) > self.options.max_inputs:
            raise EngineError(f"at most {self.options.max_inputs} inputs per request")
        n_vocab = self.vocab.n_tokens
        for index, tokens in enumerate(inputs):
            if not tokens:
                raise EngineError(f"input {index} has no tokens")
            if len(tokens) > self.max_input_tokens:
                raise ContextLengthError(
                    f"input {index} has {len(tokens)} tokens, more than the "
                    f"{self.max_input_tokens} one input may have",
                    hint="Split the text into shorter pieces.",
                )
            if any(not 0 <= token < n_vocab for token in tokens):
                raise EngineError(f"input {index} has a token outside the vocabulary")

    def _admitted(self) -> _Admission:
        return _Admission(self)

    def _submit(self, function: Callable[[], T]) -> concurrent.futures.Future[T]:
        if self._closed:
            raise EngineClosedError("the embeddings context is closed")
        try:
            return self._run(function)
        except RuntimeError as exc:  # an executor or engine that is shutting down
            raise EngineClosedError("the embeddings context is closed") from exc

    def _groups(self, inputs: Sequence[Sequence[int]]) -> list[list[Sequence[int]]]:
        """Inputs in order, packed into decodes of at most n_seq sequences and n_batch tokens."""
        groups: list[list[Sequence[int]]] = []
        tokens = 0
        for sequence in inputs:
            full = groups and (
                len(groups[-1]) >= self.options.n_seq
                or tokens + len(sequence) > self._batch.capacity
            )
            if not groups or full:
                groups.append([])
                tokens = 0
            groups[-1].append(sequence)
            tokens += len(sequence)
        return groups

    def _decode(self, group: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """On the compute thread: one decode from an empty cache, one vector per sequence."""
        import numpy as np

        context, batch = self._context, self._batch
        context.clear()
        batch.clear()
        for seq_id, tokens in enumerate(group):
            batch.add_run(tokens, 0, seq_id, output_all=True)
        status = context.decode(batch)
        if status != 0:
            raise EngineError(f"llama.cpp could not compute the embeddings (status {status})")
        vectors = []
        for seq_id in range(len(group)):
            vector = context.sequence_vector(seq_id)
            norm = float(np.linalg.norm(vector))
            vectors.append(vector / norm if norm > 0 else vector)
        return vectors

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Free the context (and the model, when it is the embedder's own)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._worker is not None:  # our own thread: let a running decode finish
            self._worker.shutdown(wait=True, cancel_futures=True)
            self._free()
            return
        try:  # on the engine's thread, between two steps (never under a running decode)
            self._run(self._free).result()
        except (RuntimeError, concurrent.futures.CancelledError):
            self._free()  # the engine has stopped: nothing computes any more

    def _free(self) -> None:
        self._batch.close()
        self._context.close()
        if self._owned_model is not None:
            self._owned_model.close()


class _Admission:
    """At most ``max_waiting`` requests wait for the context; more get BusyError at once."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder

    def __enter__(self) -> None:
        embedder = self._embedder
        with embedder._lock:
            if embedder._waiting >= embedder.options.max_waiting:
                raise BusyError(
                    f"the embeddings context is busy ({embedder._waiting} requests waiting)",
                    hint="Retry in a moment.",
                )
            embedder._waiting += 1

    def __exit__(self, *_: object) -> None:
        with self._embedder._lock:
            self._embedder._waiting -= 1


def _create(model: Model, params: EmbeddingParams) -> EmbeddingContext:
    try:
        return EmbeddingContext.create(model, params)
    except ContextCreateError as failure:
        raise EngineError(
            f"llama.cpp could not create the embeddings context: {failure.reason}",
            hint="Lower the longest embedding input, or free memory.",
        ) from None


def _n_ctx_train(model: Model) -> int:
    from homelab.llamacpp._lib import lib

    return int(lib().llama_model_n_ctx_train(model.pointer))


# --- an embedding model served alone ------------------------------------------------------------


class _NoChat:
    """The chat template of an embedding model: every conversation is refused, saying why."""

    source = ""
    supports_tools = False

    def __init__(self, refusal: EngineError) -> None:
        self._refusal = refusal

    def render(self, *_: Any, **__: Any) -> str:
        raise self._refusal


class EmbeddingModelEngine(Closing):
    """The server's engine surface for an embedding model: embeddings yes, generation no."""

    n_slots = 1
    speculation = None
    failure: str | None = None  # an embedding model is never on RPC workers
    image_marker: str | None = None  # no images

    def __init__(self, embedder: Embedder, model_info: ModelInfo, load_report: LoadReport) -> None:
        self.embedder: Embedder | None = embedder
        self._embedder = embedder
        self.model_info = model_info
        self.load_report = load_report
        self.settings = load_report.settings
        self.n_ctx_per_slot = embedder.max_input_tokens
        self.n_vocab = embedder.vocab.n_tokens
        self.chat_template = _NoChat(self._generation_refused())

    @classmethod
    def load(
        cls,
        path: str | Path,
        settings: Settings,
        info: ModelInfo,
        options: EmbeddingOptions | None = None,
    ) -> EmbeddingModelEngine:
        """Load ``path`` with the plan's placement and threads (its context is ours)."""
        started = time.perf_counter()
        threads = settings.n_threads or default_threads()
        options = replace(options or EmbeddingOptions(), n_threads=threads)
        embedder = Embedder.load(path, options, n_gpu_layers=settings.n_gpu_layers)
        report = LoadReport(
            model_path=str(path),
            planned=settings,
            settings=settings,
            steps=(LadderStep("as planned", settings, True, "embedding model"),),
            buffers=embedder.buffers,
            n_ctx=embedder.max_input_tokens,
            n_ctx_per_slot=embedder.max_input_tokens,
            n_slots=1,
            prefix_reuse=False,
            prefix_reuse_note="embeddings only: every batch starts from an empty context",
            load_s=time.perf_counter() - started,
            rss_before_bytes=0,
            rss_after_bytes=0,
        )
        return cls(embedder, info, report)

    # --- what the server calls ---------------------------------------------------------------

    @property
    def longest_token_bytes(self) -> int | None:
        return self._embedder.vocab.longest_token_bytes()

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._embedder.vocab.tokenize(text, add_bos=add_bos, parse_special=special)

    def tokenize_within(
        self, text: str, limit: int, add_bos: bool = True, special: bool = True
    ) -> list[int]:
        return tokenize_within(
            lambda piece, bos: self.tokenize(piece, bos, special), text, limit, add_bos=add_bos
        )

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._embedder.vocab.detokenize(ids, special=True)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> str:
        raise self._generation_refused()

    def submit(self, request: Any) -> Any:
        raise self._generation_refused()

    def tokenize_images(self, text: str, images: Any, add_bos: bool = True) -> Any:
        raise self._generation_refused()

    def _generation_refused(self) -> EngineError:
        return EngineError(
            f"{Path(self.load_report.model_path).name} is an embedding model "
            f"({self.model_info.architecture}): it answers /v1/embeddings only",
            hint="Serve a generative model for chat and completions.",
        )

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(
            prefill_tok_s=0.0,
            decode_tok_s=0.0,
            active_slots=0,
            n_slots=1,
            queue_depth=0,
            kv_cells_used=0,
            kv_cells_total=0,
            requests_total=0,
            requests_by_status={},
            last_ttft_s=None,
        )

    def close(self) -> None:
        self._embedder.close()
