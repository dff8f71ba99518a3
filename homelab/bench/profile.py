"""Auto-profiling: prompt (pp) and generation (tg) speed of one configuration, llama-bench style.

``pp512``: one request with a 512-token prompt and a single output token; its prefill rate.
``tg128``: one request with a short prompt generating 128 tokens (end-of-sequence ignored);
its decode rate after the first token. Each is run once as a warm-up (discarded), then
``repetitions`` times; the result keeps every sample with the median and the spread.
Requests go through the engine exactly as a user's would, one at a time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from homelab.bench.prompts import PromptSource
from homelab.engine.api import FinishEvent, GenerationRequest, RequestStats, SamplingParams
from homelab.errors import BenchError
from homelab.settings import Settings

if TYPE_CHECKING:
    from homelab.engine.engine import Engine

PP_TOKENS = 512
TG_TOKENS = 128
TG_PROMPT_TOKENS = 16
REPETITIONS = 3
WARMUPS = 1

Progress = Callable[[str], None]  # called once per finished run, with what was run


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one figure."""

    median: float
    low: float
    high: float
    stdev: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        if not samples:
            raise BenchError("no measurements were taken")
        values = tuple(float(v) for v in samples)
        stdev = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(statistics.median(values), min(values), max(values), stdev, values)

    @property
    def relative_spread(self) -> float:
        """Half the range as a fraction of the median (0.03 = ±3 %)."""
        return (self.high - self.low) / 2 / self.median if self.median else 0.0

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["samples"] = list(self.samples)
        return document


@dataclass(frozen=True)
class SpeedResult:
    """pp/tg speed of one configuration on this machine."""

    settings: Settings
    prompt_tokens: int  # pp size (512)
    generated_tokens: int  # tg size (128)
    repetitions: int
    prefill_tok_s: Spread
    decode_tok_s: Spread

    @property
    def pp_label(self) -> str:
        return f"pp{self.prompt_tokens}"

    @property
    def tg_label(self) -> str:
        return f"tg{self.generated_tokens}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings.to_dict(),
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "repetitions": self.repetitions,
            "prefill_tok_s": self.prefill_tok_s.to_dict(),
            "decode_tok_s": self.decode_tok_s.to_dict(),
        }


def run_one(
    engine: Engine,
    prompts: PromptSource,
    prompt_tokens: int,
    max_tokens: int,
    prompt: tuple[int, ...] | None = None,
) -> RequestStats:
    """One greedy request with its own prompt (or ``prompt``) and tenant; its stats."""
    request = GenerationRequest(
        tenant=prompts.tenant(),
        prompt=prompt if prompt is not None else prompts.prompt(prompt_tokens),
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
    )
    finish = None
    for event in engine.submit(request):
        if isinstance(event, FinishEvent):
            finish = event
    if finish is None or finish.reason == "error":
        problem = finish.error if finish is not None else "no finish event"
        raise BenchError(f"a benchmark request failed: {problem}")
    return finish.stats


def check_fits_slot(engine: Engine, prompt_tokens: int, generated_tokens: int) -> None:
    needed = max(prompt_tokens + 1, TG_PROMPT_TOKENS + generated_tokens)
    if needed > engine.n_ctx_per_slot:
        raise BenchError(
            f"pp{prompt_tokens}/tg{generated_tokens} needs {needed} tokens of context per slot, "
            f"but the configuration has {engine.n_ctx_per_slot}",
            hint="Plan a longer context per slot, or pass smaller --pp/--tg sizes.",
        )


def measure_speed(
    engine: Engine,
    prompts: PromptSource,
    *,
    prompt_tokens: int = PP_TOKENS,
    generated_tokens: int = TG_TOKENS,
    repetitions: int = REPETITIONS,
    warmups: int = WARMUPS,
    progress: Progress | None = None,
) -> SpeedResult:
    """pp and tg speed of the loaded configuration: warm-ups first, then the measured runs."""
    check_fits_slot(engine, prompt_tokens, generated_tokens)
    prefill, decode = [], []
    for index in range(warmups + repetitions):
        pp = run_one(engine, prompts, prompt_tokens, 1)
        _report(progress, f"pp{prompt_tokens}")
        tg = run_one(engine, prompts, TG_PROMPT_TOKENS, generated_tokens)
        _report(progress, f"tg{generated_tokens}")
        if index >= warmups:
            prefill.append(pp.prefill_tok_s)
            decode.append(tg.decode_tok_s)
    return SpeedResult(
        settings=engine.settings,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        repetitions=repetitions,
        prefill_tok_s=Spread.of(prefill),
        decode_tok_s=Spread.of(decode),
    )


def _report(progress: Progress | None, what: str) -> None:
    if progress is not None:
        progress(what)
