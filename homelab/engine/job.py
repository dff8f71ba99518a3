"""The scheduler's view of a request: queued as a :class:`Job`, placed as an :class:`AdmittedJob`.

``Engine.submit`` builds a :class:`Job` (the request, its handle, prompt tokens, sampler chain
and clock) and queues it; admission places it in a slot and makes it an
:class:`AdmittedJob`, which holds that slot until it finishes — so everything that steps a
sequence reads ``job.slot`` without asking whether there is one. A step's batch is a list of
:class:`Part` rows, one per job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homelab.engine.api import GenerationRequest
from homelab.engine.handle import RequestHandle
from homelab.engine.image_prompt import ImagePrompt
from homelab.engine.metrics import RequestClock
from homelab.engine.sampling import SamplerChain
from homelab.engine.slots import Slot
from homelab.engine.speculation.sequence import SequenceSpeculation
from homelab.engine.text import StopMatcher, Utf8Decoder
from homelab.llamacpp.mtmd import EncodedImage


@dataclass(frozen=True)
class SchedulerConfig:
    n_batch: int
    n_vocab: int
    n_ctx_per_slot: int
    prefill_chunk_tokens: int
    queue_limit: int


@dataclass(eq=False)
class JobImages:
    """A request's images and how far the one being read has got (see ``image_prefill``)."""

    prompt: ImagePrompt
    encoded: EncodedImage | None = None
    rows_done: int = 0
    encode_s: float = 0.0  # time the projector spent on this request's images

    def reset(self) -> None:
        self.encoded = None
        self.rows_done = 0


@dataclass(eq=False)
class Job:
    """A submitted request, queued until a slot is free."""

    request: GenerationRequest
    handle: RequestHandle
    prompt: list[int]
    chain: SamplerChain
    clock: RequestClock
    stop: StopMatcher | None = None
    images: JobImages | None = None  # a prompt with images (see image_prefill)


@dataclass(eq=False)
class AdmittedJob(Job):
    """A job in its slot: reading its prompt, then generating, until it finishes."""

    slot: Slot = field(kw_only=True)  # its own until released (then never touched again)
    released: bool = False  # finished: the slot is back in the table
    n_past: int = 0  # this sequence's positions in the KV cache
    prompt_pos: int = 0  # next prompt token to evaluate
    last_token: int = -1  # sampled, evaluated at the next step
    batch_index: int = -1  # the batch row whose logits this job samples
    utf8: Utf8Decoder = field(default_factory=Utf8Decoder)
    spec: SequenceSpeculation | None = None  # set at admission when the engine speculates
    # the request's sampling fields read for every token, copied once
    max_tokens: int = field(init=False)
    ignore_eos: bool = field(init=False)
    wants_logprobs: bool = field(init=False)
    # end-of-generation is banned while fewer tokens came (a grammar that has finished
    # allows nothing else, so never under a grammar)
    min_tokens: int = field(init=False)
    # its tokens are text alone: no stop strings to look for, no log-probabilities
    plain_text: bool = field(init=False)

    def __post_init__(self) -> None:
        sampling = self.request.sampling
        self.plain_text = self.stop is None and sampling.logprobs is None
        self.max_tokens = sampling.max_tokens
        self.ignore_eos = sampling.ignore_eos
        self.wants_logprobs = sampling.logprobs is not None
        self.min_tokens = 0 if sampling.grammar else sampling.min_tokens

    @classmethod
    def place(cls, job: Job, slot: Slot, n_cached: int) -> AdmittedJob:
        """``job`` in ``slot``, whose first ``n_cached`` prompt tokens are in its cache."""
        return cls(
            job.request,
            job.handle,
            job.prompt,
            job.chain,
            job.clock,
            job.stop,
            job.images,
            slot=slot,
            n_past=n_cached,
            prompt_pos=n_cached,
        )

    def before_min_tokens(self) -> bool:
        """Whether end-of-generation is still banned (``min_tokens`` not reached)."""
        return self.clock.completion_tokens < self.min_tokens


@dataclass
class Part:
    """One job's tokens in this step's batch."""

    job: AdmittedJob
    start_pos: int
    tokens: list[int]
    sample: bool  # take logits for the last token and sample after the decode
    prefill: bool
    draft: tuple[int, ...] = ()  # drafted tokens (tokens = [last, *draft]): verify them
    first_row: int = -1


def seq_id(job: AdmittedJob) -> int:
    """The sequence id of a job's slot (the generating list and every batch go in this order:
    with one cache stream per slot, llama.cpp splits a batch wherever the next sequence id is
    not the last one plus one)."""
    return job.slot.seq_id
