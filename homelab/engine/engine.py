"""The engine: a loaded model serving many requests at once through one scheduler.

    with Engine.load(path, settings) as engine:
        handle = engine.submit(GenerationRequest(tenant="alice", prompt="Hello"))
        for event in handle:            # or: async for event in handle.events()
            ...

Speculative decoding is a load option: ``Engine.load(path, settings,
speculation=SpeculationConfig(kind="ngram"))`` (prompt lookup) or ``SpeculationConfig(
kind="draft", draft_path=...)`` (a small model with the same vocabulary); see
``homelab.engine.speculation``. Outputs are the same tokens (greedy) or the same distribution
(sampling) as without it.

``submit`` checks everything that can be checked before compute (context length, queue
bound, token ids, grammar) and raises ``ContextLengthError`` / ``BusyError`` /
``EngineError`` synchronously; after that, problems arrive as a ``FinishEvent`` with
``reason="error"``. The tenant comes from the caller (the server derives it from the API
key) and decides which prefix cache a request may use; it is never read from request fields.

All llama.cpp compute of an engine runs on the process's compute lane
(``homelab.llamacpp.lane``), which steps every engine's scheduler in turn. Keep it the only
thread of the process that runs llama.cpp compute: ggml's CPU backend uses OpenMP, and a
second computing thread (another engine, a llama-cpp-python ``Llama``) makes libgomp's
thread teams interfere — measured 15-20 % slower decoding at 2 threads (see
benchmarks/RESULTS.md).

A loaded engine freezes the garbage collector's view of the heap (``gc.freeze``): the objects
that exist once a model is loaded (the imports, the server, the TUI) are never traversed
again. Otherwise the tokens a request keeps until it ends push the collector into a full
collection now and then, which walks every object of the process on the compute lane: 20 ms
in a bare engine process, 35 ms with the server loaded — whole steps of every sequence.
Closing an engine unfreezes, so what it leaves in reference cycles is still collected; loading
one collects before it freezes, or the cycles a closed engine left (its scheduler, batches,
model header: ~1 MiB for the tiny demo model) would be frozen for good before any collection
ran — what grew the RSS of a server that yields and resumes by ~1 MiB a cycle (issue #41,
``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import gc
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from homelab.engine.amx_check import refuse_crashing_build
from homelab.engine.api import EngineMetrics, GenerationRequest
from homelab.engine.chat_template import ChatTemplate
from homelab.engine.handle import RequestHandle
from homelab.engine.image_prefill import ImagePrefill, check_image_prompt, image_prompt
from homelab.engine.image_prompt import ImagePrompt
from homelab.engine.job import Job, JobImages, SchedulerConfig
from homelab.engine.loader import LoadedModel, LoadReport, load_model
from homelab.engine.metrics import EngineMeter, RequestClock, StepProfile
from homelab.engine.prompt_bound import tokenize_within
from homelab.engine.sampling import SamplerChain
from homelab.engine.scheduler import Scheduler
from homelab.engine.slots import SlotState, SlotTable
from homelab.engine.speculation.config import SpeculationConfig
from homelab.engine.speculation.refusals import check_target
from homelab.engine.speculation.speculator import Speculator
from homelab.engine.text import StopMatcher
from homelab.errors import (
    BusyError,
    ContextLengthError,
    EngineClosedError,
    EngineError,
    HomelabError,
)
from homelab.gguf.model import ModelInfo
from homelab.gguf.reader import read_model
from homelab.images.decoded import DecodedImage
from homelab.llamacpp import abort as rpc_abort
from homelab.llamacpp import lane
from homelab.llamacpp._lib import Closing
from homelab.llamacpp.context import Context
from homelab.llamacpp.mtmd import Projector, PromptChunk
from homelab.llamacpp.rpc import worker_lost
from homelab.settings import Settings

if TYPE_CHECKING:
    from homelab.engine.embeddings import Embedder
    from homelab.engine.prompt_cache.slot_states import SlotStates
    from homelab.engine.prompt_cache.store import PromptCache

_request_ids = itertools.count(1)
PROFILE_STEPS_ENV = "HOMELAB_PROFILE_STEPS"  # set: every step timed by phase (EngineMetrics)
log = logging.getLogger("homelab.engine")
T = TypeVar("T")


class Engine(Closing):
    """A model loaded with llama.cpp plus the continuous-batching scheduler in front of it."""

    def __init__(
        self,
        loaded: LoadedModel,
        model_info: ModelInfo,
        *,
        queue_limit: int = 64,
        prefill_chunk_tokens: int | None = None,
        speculator: Speculator | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        self._loaded = loaded
        self._speculator = speculator
        self.speculation: SpeculationConfig | None = speculator.config if speculator else None
        self.model_info = model_info
        self.load_report: LoadReport = loaded.report
        self.settings: Settings = loaded.report.settings
        self._vocab = vocab = loaded.model.vocab
        self.n_vocab = vocab.n_tokens
        self.n_ctx_per_slot = loaded.report.n_ctx_per_slot
        self.n_slots = loaded.report.n_slots
        self.bos_token_id = vocab.bos
        self.eog_tokens = vocab.end_of_generation_tokens()
        self._meter = EngineMeter(
            self.n_slots, loaded.report.n_ctx, speculator.kind if speculator else None
        )
        self._slots = slots = SlotTable(
            self.n_slots,
            loaded.context.memory,
            prefix_reuse=loaded.report.prefix_reuse,
            n_swa=0 if self.settings.swa_full else model_info.n_swa,
            contiguous=not loaded.context.memory.one_stream,
        )
        self._scheduler = self._make_scheduler(loaded, queue_limit, prefill_chunk_tokens)
        self._meter.live_queue_depth = lambda: self._scheduler.queue_depth
        self.prompt_states = slots.keeper = self._slot_states(prompt_cache)
        self._meter.live_occupancy = lambda: (slots.n_busy, slots.cells_used())
        self._chat_template = self._make_chat_template()
        self._closed = False
        self.embedder: Embedder | None = None  # an Embedder on this model (see embeddings.py)
        self._close_lock = threading.Lock()
        self._failure: EngineError | None = None
        self._unwatch = self._watch_workers()
        self._scheduler.start()

    # --- construction ------------------------------------------------------------------

    def _make_scheduler(
        self, loaded: LoadedModel, queue_limit: int, prefill_chunk_tokens: int | None
    ) -> Scheduler:
        """The scheduler in front of the loaded context (its step profile when asked for)."""
        n_batch = loaded.context.n_batch
        if self.n_slots > n_batch:
            raise EngineError(
                f"{self.n_slots} slots need a batch of at least {self.n_slots} tokens "
                f"(n_batch is {n_batch})",
                hint="Raise n_batch or lower the number of parallel slots.",
            )
        chunk = prefill_chunk_tokens or loaded.context.n_ubatch
        config = SchedulerConfig(n_batch, self.n_vocab, self.n_ctx_per_slot, chunk, queue_limit)
        profile = StepProfile() if os.environ.get(PROFILE_STEPS_ENV) else None
        self._meter.step_profile = profile
        projector = loaded.projector
        images = ImagePrefill(loaded.context, projector) if projector is not None else None
        return Scheduler(
            loaded.context,
            self._vocab,
            self._slots,
            self._meter,
            config,
            self.eog_tokens,
            self._speculator,
            profile,
            images,
        )

    @classmethod
    def load(
        cls,
        model_path: str | Path,
        settings: Settings,
        *,
        queue_limit: int = 64,
        on_oom_ladder: bool = True,
        prefill_chunk_tokens: int | None = None,
        predicted: Mapping[str, Any] | None = None,
        record_calibration: bool = True,
        speculation: SpeculationConfig | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> Engine:
        """Load ``model_path`` with ``settings`` (stepping down on OOM) and start serving.

        ``predicted`` (the planner's memory prediction) is stored next to what was really
        allocated in the calibration record. ``speculation`` turns on speculative decoding;
        a target or draft it cannot work with raises ``SpeculationError`` (an EngineError).
        ``prompt_cache`` (``homelab.engine.prompt_cache``) keeps slot states beyond the slot.
        """
        if speculation is not None:
            speculation.checked()
        info = read_model(model_path)
        refuse_crashing_build(info.file_type)  # a build that would end the process at once
        loaded = load_model(model_path, settings, info=info, oom_ladder=on_oom_ladder)
        speculator = None
        try:
            if speculation is not None:
                speculator = _speculator(loaded, info, speculation, prefill_chunk_tokens)
            engine = cls(
                loaded,
                info,
                queue_limit=queue_limit,
                prefill_chunk_tokens=prefill_chunk_tokens,
                speculator=speculator,
                prompt_cache=prompt_cache,
            )
        except BaseException:
            if speculator is not None:
                speculator.close()
            loaded.close()
            raise
        if record_calibration:
            from homelab.engine.calibration import record_load

            record_load(engine.load_report, info, predicted)
        gc.collect()  # first: garbage frozen with the rest would never be freed (above)
        gc.freeze()  # the heap of a loaded process is out of the collector's way (above)
        return engine

    def _slot_states(self, cache: PromptCache | None) -> SlotStates | None:
        """The prompt cache's side of this engine, or None (no cache, or a model it refuses)."""
        if cache is None:
            return None
        if not self._loaded.report.prefix_reuse or self.model_info.is_recurrent:
            log.info(
                "prompt cache off for %s: a recurrent state cannot be cut back to a shorter "
                "prefix (prefix reuse is off for this model)",
                self.model_info.name,
            )
            return None
        from homelab.engine.prompt_cache.key import ModelKey, layout_of
        from homelab.engine.prompt_cache.slot_states import SlotStates
        from homelab.gguf.identity import model_identity

        layout = layout_of(self.settings, self.n_ctx_per_slot, self.n_slots)
        try:
            model = ModelKey(model_identity(self._loaded.report.model_path), layout)
        except (HomelabError, OSError) as exc:  # the file moved since it was loaded
            log.warning("prompt cache off for %s: %s", self.model_info.name, exc)
            return None
        meter = self._meter
        n_swa = self.model_info.n_swa if self.model_info.has_swa else 0
        return SlotStates(
            self._loaded.context,
            model,
            cache,
            lambda: meter.snapshot().prefill_tok_s,
            n_swa=n_swa,
        )

    def _make_chat_template(self) -> ChatTemplate | None:
        source = self.model_info.chat_template
        if not source:
            return None
        bos = self._vocab.token_bytes(self.bos_token_id, special=True).decode(errors="replace")
        eos = self._vocab.token_bytes(self._vocab.eos, special=True).decode(errors="replace")
        try:
            return ChatTemplate(source, bos, eos)
        except EngineError:
            return None  # a template that does not compile: chat is unavailable, raw works

    # --- text ----------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        tokens = self._vocab.tokenize(text, add_bos=add_bos, parse_special=special)
        if add_bos and len(tokens) > 1 and tokens[0] == tokens[1] == self.bos_token_id:
            del tokens[0]  # the text (e.g. a rendered chat template) already starts with BOS
        return tokens

    def tokenize_within(
        self, text: str, limit: int, add_bos: bool = True, special: bool = True
    ) -> list[int]:
        """``tokenize``, refusing (ContextLengthError) a text of more than ``limit`` tokens
        after work bounded by ``limit``, not by the text's size (see ``prompt_bound``)."""
        return tokenize_within(
            lambda piece, bos: self.tokenize(piece, add_bos=bos, special=special),
            text,
            limit,
            add_bos=add_bos,
            longest_token_bytes=lambda: self.longest_token_bytes,
        )

    @functools.cached_property
    def longest_token_bytes(self) -> int | None:
        """The most bytes of text one token stands for (None: the vocabulary normalises)."""
        return self._vocab.longest_token_bytes()

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._vocab.detokenize(ids, special=True)

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._chat_template

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        if self._chat_template is None:
            raise EngineError(
                "this model has no usable chat template",
                hint="Send a plain completion prompt instead.",
            )
        return self._chat_template.render(messages, tools=tools, add_generation_prompt=True)

    # --- requests ----------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request; raises before any compute when it cannot be served."""
        submitted = time.perf_counter()
        if self._failure is not None:
            raise self._failure
        if self._closed or self._scheduler.closing:
            raise EngineClosedError("the engine is closed")
        prompt = self._prompt_tokens(request)
        n_cells = request.images.n_cells if request.images is not None else len(prompt)
        self._check_lengths(n_cells, request.sampling.max_tokens)
        chain = SamplerChain(request.sampling, self._vocab, self.n_vocab, self.eog_tokens)
        request_id = request.request_id or f"req-{next(_request_ids)}"
        handle = RequestHandle(request_id, self._scheduler.cancel_noted, self._scheduler.wakes)
        stops = request.sampling.stop
        job = Job(
            request=request,
            handle=handle,
            prompt=prompt,
            chain=chain,
            clock=RequestClock(submitted=submitted, prompt_tokens=n_cells),
            stop=StopMatcher(stops) if stops else None,
            images=JobImages(request.images) if request.images is not None else None,
        )
        if not self._scheduler.enqueue(job):
            chain.close()
            self._meter.record_rejected()
            raise BusyError(
                f"the engine is busy ({self._scheduler.config.queue_limit} requests waiting)",
                hint="Retry in a moment.",
            )
        return handle

    def _prompt_tokens(self, request: GenerationRequest) -> list[int]:
        if request.images is not None:
            return self._checked_image_prompt(request.images)
        if isinstance(request.prompt, str):
            limit = self.n_ctx_per_slot - 1  # the exact check with max_tokens comes next
            tokens = self.tokenize_within(request.prompt, limit, add_bos=request.add_bos)
        else:
            tokens = [int(token) for token in request.prompt]
            bad = [token for token in tokens if not 0 <= token < self.n_vocab]
            if bad:
                raise EngineError(
                    f"prompt token {bad[0]} is outside this model's vocabulary "
                    f"(0..{self.n_vocab - 1})"
                )
        if not tokens:
            raise EngineError("the prompt is empty", hint="Send at least one token of text.")
        return tokens

    def _check_lengths(self, n_prompt: int, max_tokens: int) -> None:
        if max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1 (got {max_tokens})")
        needed = n_prompt + max_tokens
        if needed > self.n_ctx_per_slot:
            raise ContextLengthError(
                f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) needs "
                f"{needed} tokens, but a slot holds {self.n_ctx_per_slot}",
                hint="Shorten the prompt, lower max_tokens, or plan a longer context per slot.",
            )

    # --- images ---------------------------------------------------------------------------

    @property
    def projector(self) -> Projector | None:
        """The vision projector loaded beside the model (None: text only)."""
        return self._loaded.projector

    @property
    def image_marker(self) -> str | None:
        """What stands for an image in a prompt's text (None: this model takes no images)."""
        projector = self._loaded.projector
        return projector.marker if projector is not None else None

    def tokenize_images(
        self, text: str, images: Sequence[DecodedImage], add_bos: bool = True
    ) -> ImagePrompt:
        """``text`` with one :attr:`image_marker` per image, tokenized with the images (any
        thread): the prompt to submit as ``GenerationRequest(images=...)``."""
        projector = self._loaded.projector
        if projector is None:
            raise EngineError(
                f"{self.model_info.name} takes no images (no vision projector is loaded)",
                hint="Load the model with its mmproj file to send images.",
            )
        chunks = projector.tokenize(text, images, add_special=add_bos)
        prompt = image_prompt(_without_double_bos(chunks, self.bos_token_id), images)
        check_image_prompt(
            prompt, non_causal=projector.non_causal, n_ubatch=self._loaded.context.n_ubatch
        )
        return prompt

    def _checked_image_prompt(self, prompt: ImagePrompt) -> list[int]:
        projector = self._loaded.projector
        if projector is None:
            raise EngineError(f"{self.model_info.name} takes no images")
        if not prompt.tokens:
            raise EngineError("the prompt is empty", hint="Send at least one token of text.")
        n_ubatch = self._loaded.context.n_ubatch
        check_image_prompt(prompt, non_causal=projector.non_causal, n_ubatch=n_ubatch)
        return list(prompt.tokens)

    # --- a lost RPC worker ---------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        """Why this engine can serve nothing more (a lost RPC worker), or None."""
        return str(self._failure) if self._failure is not None else None

    def _watch_workers(self) -> Callable[[], None]:
        if not self.settings.rpc_servers:
            return lambda: None
        return rpc_abort.watch(self._lose_worker)

    def _lose_worker(self, abort_message: str) -> None:
        """llama.cpp lost a worker (on the aborting thread, which then parks for good)."""
        self._failure = worker_lost(self.settings.rpc_servers, abort_message)
        log.error("%s", self._failure)
        self._scheduler.fail(str(self._failure))

    # --- metrics ---------------------------------------------------------------------------

    def metrics(self) -> EngineMetrics:
        return self._meter.snapshot()

    def subscribe(
        self, callback: Callable[[EngineMetrics], None], interval_s: float = 0.5
    ) -> Callable[[], None]:
        """Call ``callback`` from the engine thread every ``interval_s``; returns unsubscribe."""
        unsubscribe = self._meter.subscribe(callback, interval_s)
        self._scheduler.wake()
        return unsubscribe

    def slot_states(self, timeout_s: float = 5.0) -> tuple[SlotState, ...]:
        """Each slot's tenant, occupancy and llama.cpp cache range (read between steps)."""
        return self.run_on_engine_thread(self._slots.states).result(timeout_s)

    def slot_action(
        self, seq_id: int, action: str, tenant: str | None = None, timeout_s: float = 60.0
    ) -> dict[str, object]:
        """Save, restore or erase one free slot by hand (the admin API; see
        ``prompt_cache.slot_states.slot_action``); EngineError / BusyError say why not."""
        from homelab.engine.prompt_cache.slot_states import slot_action

        slots, states = self._slots, self.prompt_states
        call = self.run_on_engine_thread(lambda: slot_action(slots, states, seq_id, action, tenant))
        result = call.result(timeout_s)
        written = result.get("on_disk")
        if isinstance(written, concurrent.futures.Future):  # a save: written by the cache's writer
            result["on_disk"] = written.result(timeout_s)
        return result

    def forget_tenant(
        self, tenant: str | None, model_id: str | None = None, timeout_s: float = 60.0
    ) -> int:
        """Empty the slots holding ``tenant``'s cells (a name: each identity of it; an
        identity; None: every tenant) so that none is saved back into the prompt cache once
        its states are cleared: free slots now, busy ones when their request ends. With
        ``model_id`` (a model identity or its start), only if this engine's model is it.
        How many slots."""
        from homelab.engine.prompt_cache.key import tenant_matches

        states = self.prompt_states
        if model_id and (states is None or not states.model.model_id.startswith(model_id)):
            return 0
        forget = functools.partial(
            self._slots.forget, functools.partial(tenant_matches, wanted=tenant)
        )
        return self.run_on_engine_thread(forget).result(timeout_s)

    def end_requests(self, reason: str, timeout_s: float = 10.0) -> int:
        """End every request in flight now with ``reason`` (an error its client sees: the
        server gives its GPU back, ``server.yielding``); how many were ended. The engine is
        meant to close next: what they would still compute is discarded."""

        scheduler = self._scheduler
        return self.run_on_engine_thread(lambda: scheduler.end_all(reason)).result(timeout_s)

    def run_on_engine_thread(self, function: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``function`` on the engine thread between two decode steps.

        The only safe way to touch the llama.cpp context from outside (diagnostics, tests).
        """
        return self._scheduler.call_between_steps(function)

    @property
    def context(self) -> Context:
        """The llama.cpp context (use only inside :meth:`run_on_engine_thread`)."""
        return self._loaded.context

    # --- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel what is in flight, stop the scheduler and free llama.cpp's memory."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._unwatch()
        self._save_states()
        self._scheduler.close()
        if self._failure is not None or self._scheduler.running:
            return  # a decode that never returns (a lost worker): leak, don't free or join
        if self.embedder is not None:  # its context lives on our model: free it first
            self.embedder.close()
        if self._speculator is not None:
            self._speculator.close()
        self._loaded.close()
        gc.unfreeze()  # what this engine leaves in cycles can be collected again

    def _save_states(self, timeout_s: float = 60.0) -> None:
        """Keep every slot's prefix in the prompt cache before the context goes."""
        states = self.prompt_states
        if states is None or self._failure is not None:
            return
        try:
            if lane.on_lane():  # closed from a step (waiting for the lane would never end)
                saved = self._slots.save_states()
            else:
                saved = self._keep_slots(states, timeout_s)
        except Exception as exc:  # closing must go on whatever the cache does
            log.warning("prompt cache: slot states not saved at close: %s", exc)
            return
        log.info("prompt cache: %d slot states saved at close", saved)

    def _keep_slots(self, states: SlotStates, timeout_s: float) -> int:
        """Each slot's state taken on the lane, one at a time, and kept from this thread,
        which may wait for the cache's writer to make room (the lane never does)."""
        saved = 0
        for slot in self._slots.slots:
            capture = functools.partial(states.capture, slot)
            captured = self.run_on_engine_thread(capture).result(timeout_s)
            saved += captured is not None and states.keep(captured, wait=True)
        return saved


def _without_double_bos(chunks: list[PromptChunk], bos: int) -> list[PromptChunk]:
    """The text (a rendered chat template) may already start with BOS: mtmd adds another."""
    first = chunks[0] if chunks else None
    if first is None or len(first.tokens) < 2 or first.tokens[0] != bos or first.tokens[1] != bos:
        return chunks
    shorter = replace(first, tokens=first.tokens[1:], n_tokens=len(first.tokens) - 1)
    return [replace(shorter, n_pos=shorter.n_tokens), *chunks[1:]]


def _speculator(
    loaded: LoadedModel,
    info: ModelInfo,
    config: SpeculationConfig,
    prefill_chunk_tokens: int | None,
) -> Speculator:
    """Check the target can speculate; load the draft model beside it if there is one."""
    settings = loaded.report.settings
    check_target(
        info.architecture,
        recurrent=loaded.model.keeps_recurrent_state,
        n_swa=info.n_swa,
        swa_full=settings.swa_full,
    )
    vocab = loaded.model.vocab
    if config.kind == "ngram":
        return Speculator(config, vocab.end_of_generation_tokens())
    from homelab.engine.speculation.draft_model import DraftModel

    assert config.draft_path is not None
    gpu_layers = (
        settings.n_gpu_layers if config.draft_gpu_layers is None else config.draft_gpu_layers
    )
    draft = DraftModel.load(
        config.draft_path,
        vocab,
        loaded.context.params,
        n_gpu_layers=gpu_layers,
        catch_up_tokens=prefill_chunk_tokens or loaded.context.n_ubatch,
        p_min=config.draft_p_min,
    )
    return Speculator(config, vocab.end_of_generation_tokens(), draft)
