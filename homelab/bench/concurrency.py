"""The concurrency × K/V-type table: throughput as more requests share the machine.

For every K/V type and every concurrency level the planner is asked first whether that many
slots of the fixed per-request context fit the memory budget with that cache type; levels
that do not fit are recorded as such and never loaded. For each K/V type the engine is
loaded once, with as many slots as the largest fitting level (slots that sit idle cost no
compute: each sequence attends only to its own cells), and every fitting level is measured
by submitting that many requests at once, each with its own prompt and tenant.

Aggregate decode tok/s is the tokens all streams generated, divided by the time from the
first stream's first token to the last stream's last token (llama-batched-bench's S_TG in
spirit: the prompt phase before the first token is left out). The times come from the
engine's own per-request clock (submission + TTFT, then completion tokens at the request's
decode rate), not from when a Python thread got around to reading a token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from homelab.bench.prompts import PromptSource
from homelab.engine.api import FinishEvent, GenerationRequest, RequestStats, SamplingParams
from homelab.errors import BenchError
from homelab.settings import COMPARED_KV_TYPES, Settings

if TYPE_CHECKING:
    from homelab.engine.engine import Engine
    from homelab.engine.handle import RequestHandle

CONCURRENCY_LEVELS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class FitVerdict:
    """The planner's answer for one (K/V type, slots) pair."""

    fits: bool
    settings: Settings | None  # what to load when it fits
    total_bytes: int | None  # predicted memory of the configuration
    reason: str = ""  # why it does not fit


FitCheck = Callable[[str, int], FitVerdict]  # (kv_type, concurrency) -> verdict
EngineLoader = Callable[[Settings], "Engine"]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class LevelResult:
    """One cell of the table."""

    kv_type: str
    concurrency: int
    fits: bool
    predicted_bytes: int | None = None
    reason: str = ""  # why it does not fit / was not measured
    aggregate_decode_tok_s: float | None = None
    mean_stream_decode_tok_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    aggregate_samples: tuple[float, ...] = ()  # one per repetition (the figures are medians)
    wall_s: float | None = None

    @property
    def measured(self) -> bool:
        return self.aggregate_decode_tok_s is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ConcurrencyTable:
    n_ctx_per_request: int
    prompt_tokens: int
    generated_tokens: int
    budget_bytes: int | None
    repeats: int
    kv_types: tuple[str, ...]
    levels: tuple[int, ...]
    cells: tuple[LevelResult, ...] = field(default=())

    def cell(self, kv_type: str, concurrency: int) -> LevelResult | None:
        for cell in self.cells:
            if cell.kv_type == kv_type and cell.concurrency == concurrency:
                return cell
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_ctx_per_request": self.n_ctx_per_request,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "budget_bytes": self.budget_bytes,
            "repeats": self.repeats,
            "kv_types": list(self.kv_types),
            "levels": list(self.levels),
            "cells": [cell.to_dict() for cell in self.cells],
        }


# --- one level ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamTrace:
    """One request as the engine timed it (times in ``time.perf_counter`` seconds)."""

    submitted: float
    stats: RequestStats

    @property
    def first_token_at(self) -> float:
        return self.submitted + self.stats.ttft_s

    @property
    def finished_at(self) -> float:
        after_first = self.stats.completion_tokens - 1
        rate = self.stats.decode_tok_s
        return self.first_token_at + (after_first / rate if after_first > 0 and rate > 0 else 0.0)


def _finish(handle: RequestHandle) -> RequestStats:
    finish = None
    for event in handle:
        if isinstance(event, FinishEvent):
            finish = event
    if finish is None or finish.reason == "error":
        problem = finish.error if finish is not None else "it never finished"
        raise BenchError(f"a benchmark request failed: {problem}")
    return finish.stats


def run_concurrent(
    engine: Engine, prompts: PromptSource, concurrency: int, prompt_tokens: int, max_tokens: int
) -> list[StreamTrace]:
    """Submit ``concurrency`` requests at once, then collect each one's stats."""
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    submitted = []
    for _ in range(concurrency):
        request = GenerationRequest(prompts.tenant(), prompts.prompt(prompt_tokens), sampling)
        at = time.perf_counter()
        submitted.append((at, engine.submit(request)))
    return [StreamTrace(at, _finish(handle)) for at, handle in submitted]


def aggregate_decode_tok_s(traces: Sequence[StreamTrace]) -> float:
    """All generated tokens over the span from the first first-token to the last token."""
    if not traces:
        return 0.0
    first = min(t.first_token_at for t in traces)
    last = max(t.finished_at for t in traces)
    generated = sum(t.stats.completion_tokens for t in traces) - 1  # the first one starts the span
    return generated / (last - first) if last > first and generated > 0 else 0.0


def level_result(
    kv_type: str, verdict: FitVerdict, runs: Sequence[Sequence[StreamTrace]], wall_s: float
) -> LevelResult:
    """The cell from one or more runs of the level: the median of each figure over the runs."""
    per_run = [_run_figures(traces) for traces in runs]
    return LevelResult(
        kv_type=kv_type,
        concurrency=len(runs[0]),
        fits=True,
        predicted_bytes=verdict.total_bytes,
        aggregate_decode_tok_s=_median(f[0] for f in per_run),
        mean_stream_decode_tok_s=_median(f[1] for f in per_run),
        ttft_p50_s=_median(f[2] for f in per_run),
        ttft_p95_s=_median(f[3] for f in per_run),
        aggregate_samples=tuple(f[0] for f in per_run),
        wall_s=wall_s,
    )


def _run_figures(traces: Sequence[StreamTrace]) -> tuple[float, float, float, float]:
    ttft = np.array([t.stats.ttft_s for t in traces])
    return (
        aggregate_decode_tok_s(traces),
        float(np.mean([t.stats.decode_tok_s for t in traces])),
        float(np.percentile(ttft, 50)),
        float(np.percentile(ttft, 95)),
    )


def _median(values: Iterable[float]) -> float:
    return float(np.median(list(values)))


# --- the table ---------------------------------------------------------------------------


def measure_table(
    fit_check: FitCheck,
    load_engine: EngineLoader,
    *,
    n_ctx_per_request: int,
    prompt_tokens: int,
    generated_tokens: int,
    budget_bytes: int | None,
    kv_types: Sequence[str] = COMPARED_KV_TYPES,
    levels: Sequence[int] = CONCURRENCY_LEVELS,
    repeats: int = 1,
    progress: Progress | None = None,
) -> ConcurrencyTable:
    """Ask the planner about every cell, then measure the cells that fit."""
    if prompt_tokens + generated_tokens > n_ctx_per_request:
        raise BenchError(
            f"a request of {prompt_tokens} + {generated_tokens} tokens does not fit the "
            f"per-request context of {n_ctx_per_request}",
            hint="Raise --ctx-per-request or lower --prompt-tokens/--gen-tokens.",
        )
    cells: list[LevelResult] = []
    for kv_type in kv_types:
        verdicts = {level: fit_check(kv_type, level) for level in levels}
        cells += _measure_kv_type(
            kv_type, verdicts, load_engine, prompt_tokens, generated_tokens, repeats, progress
        )
    return ConcurrencyTable(
        n_ctx_per_request=n_ctx_per_request,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        budget_bytes=budget_bytes,
        repeats=repeats,
        kv_types=tuple(kv_types),
        levels=tuple(levels),
        cells=tuple(cells),
    )


def _measure_kv_type(
    kv_type: str,
    verdicts: dict[int, FitVerdict],
    load_engine: EngineLoader,
    prompt_tokens: int,
    generated_tokens: int,
    repeats: int,
    progress: Progress | None,
) -> list[LevelResult]:
    fitting = [level for level, verdict in verdicts.items() if verdict.fits]
    results = {
        level: LevelResult(kv_type, level, False, verdict.total_bytes, verdict.reason)
        for level, verdict in verdicts.items()
        if not verdict.fits
    }
    if fitting:
        largest = verdicts[max(fitting)]
        assert largest.settings is not None
        engine = load_engine(largest.settings)
        try:
            prompts = PromptSource.from_tokenizer(lambda text: engine.tokenize(text, add_bos=False))
            _warm_up(engine, prompts, prompt_tokens)
            for level in sorted(fitting):
                started = time.perf_counter()
                runs = [
                    run_concurrent(engine, prompts, level, prompt_tokens, generated_tokens)
                    for _ in range(repeats)
                ]
                wall_s = time.perf_counter() - started
                results[level] = level_result(kv_type, verdicts[level], runs, wall_s)
                _report(progress, f"K/V {kv_type} × {level}")
        finally:
            engine.close()
    for level in verdicts:
        if not verdicts[level].fits:
            _report(progress, f"K/V {kv_type} × {level} (does not fit)")
    return [results[level] for level in sorted(verdicts)]


def _warm_up(engine: Engine, prompts: PromptSource, prompt_tokens: int) -> None:
    run_concurrent(engine, prompts, 1, prompt_tokens, 4)


def _report(progress: Progress | None, what: str) -> None:
    if progress is not None:
        progress(what)
