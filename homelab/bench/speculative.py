"""``homelab bench MODEL --spec ngram | --draft MODEL``: does speculative decoding pay here?

Speculation can win 1.5x or lose (each drafted token is an extra row of the target's batch,
nearly free on a GPU, not on every CPU), so it is measured, not assumed: the tg run of the
planned configuration, plain and speculating, two engines loaded side by side in this process
and their runs interleaved (plain, speculative, plain, …) after one warm-up each, the same
prompts, greedy. Reported: decode tok/s of both (median and spread), their ratio, and what
speculation did — the share of drafted tokens the target accepted and the tokens a sequence
gained per target step. The engine's adaptive drafting backs off where it loses, so the ratio
shows what it gains and what trying costs. Only the plain figures go into the hardware profile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homelab.bench.profile import TG_PROMPT_TOKENS, WARMUPS, Spread, check_fits_slot, run_one

if TYPE_CHECKING:
    from homelab.bench.concurrency import Progress
    from homelab.bench.prompts import PromptSource
    from homelab.engine.engine import Engine
    from homelab.engine.speculation.config import SpeculationConfig
    from homelab.settings import Settings


@dataclass(frozen=True)
class SpeculationResult:
    """Plain vs speculative decode of one configuration on this machine."""

    kind: str  # "ngram" or "draft"
    draft_path: str | None
    max_draft_tokens: int
    adaptive: bool
    generated_tokens: int
    repetitions: int
    plain_tok_s: Spread
    speculative_tok_s: Spread
    drafted_tokens: int  # over the measured runs
    accepted_tokens: int
    steps: int  # target steps (llama_decode calls) of the measured speculative runs

    @property
    def ratio(self) -> float:
        plain = self.plain_tok_s.median
        return self.speculative_tok_s.median / plain if plain else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def tokens_per_target_step(self) -> float | None:
        """Tokens a sequence gained per target step (1.0: no speculation paid)."""
        generated = self.repetitions * self.generated_tokens
        return generated / self.steps if self.steps else None

    @property
    def label(self) -> str:
        what = (
            "prompt lookup" if self.kind == "ngram" else f"draft {Path(self.draft_path or '').name}"
        )
        mode = "adaptive" if self.adaptive else "fixed"
        return f"{what}, up to {self.max_draft_tokens} tokens ({mode})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "draft_path": self.draft_path,
            "max_draft_tokens": self.max_draft_tokens,
            "adaptive": self.adaptive,
            "generated_tokens": self.generated_tokens,
            "repetitions": self.repetitions,
            "plain_tok_s": self.plain_tok_s.to_dict(),
            "speculative_tok_s": self.speculative_tok_s.to_dict(),
            "ratio": self.ratio,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_target_step": self.tokens_per_target_step,
        }


@dataclass(frozen=True)
class _Counters:
    drafted: int
    accepted: int
    steps: int

    @classmethod
    def of(cls, engine: Engine) -> _Counters:
        metrics = engine.metrics()
        return cls(
            metrics.draft_tokens_total, metrics.accepted_draft_tokens_total, metrics.steps_total
        )


def measure_speculation(
    plain: Engine,
    speculative: Engine,
    prompts: PromptSource,
    *,
    generated_tokens: int,
    repetitions: int,
    progress: Progress | None = None,
) -> SpeculationResult:
    """Interleaved tg runs of ``plain`` and ``speculative`` (see the module docstring)."""
    config = speculative.speculation
    assert config is not None, "the speculative engine was loaded without speculation"
    for engine in (plain, speculative):
        check_fits_slot(engine, TG_PROMPT_TOKENS, generated_tokens)
    plain_runs: list[float] = []
    spec_runs: list[float] = []
    before = _Counters.of(speculative)
    for index in range(WARMUPS + repetitions):
        prompt_tokens = prompts.prompt(TG_PROMPT_TOKENS)  # the same prompt for both, fresh tenants
        if index == WARMUPS:
            before = _Counters.of(speculative)
        for engine, runs in ((plain, plain_runs), (speculative, spec_runs)):
            stats = run_one(engine, prompts, TG_PROMPT_TOKENS, generated_tokens, prompt_tokens)
            if index >= WARMUPS:
                runs.append(stats.decode_tok_s)
            if progress is not None:
                progress("tg plain" if engine is plain else f"tg {config.kind}")
    after = _Counters.of(speculative)
    return SpeculationResult(
        kind=config.kind,
        draft_path=str(config.draft_path) if config.draft_path else None,
        max_draft_tokens=config.max_draft_tokens,
        adaptive=config.adaptive,
        generated_tokens=generated_tokens,
        repetitions=repetitions,
        plain_tok_s=Spread.of(plain_runs),
        speculative_tok_s=Spread.of(spec_runs),
        drafted_tokens=after.drafted - before.drafted,
        accepted_tokens=after.accepted - before.accepted,
        steps=after.steps - before.steps,
    )


def run_speculation(
    path: Path,
    settings: Settings,
    config: SpeculationConfig,
    *,
    threads: int | None,
    generated_tokens: int,
    repetitions: int,
    progress: Progress | None = None,
) -> SpeculationResult:
    """Load the plain and the speculative engine for ``settings`` and measure both."""
    from homelab.bench.prompts import PromptSource
    from homelab.engine.engine import Engine

    if threads is not None:
        settings = replace(settings, n_threads=threads)
    with (
        Engine.load(path, settings, record_calibration=False, on_oom_ladder=False) as plain,
        Engine.load(
            path, settings, record_calibration=False, on_oom_ladder=False, speculation=config
        ) as speculative,
    ):
        prompts = PromptSource.from_tokenizer(lambda text: plain.tokenize(text, add_bos=False))
        return measure_speculation(
            plain,
            speculative,
            prompts,
            generated_tokens=generated_tokens,
            repetitions=repetitions,
            progress=progress,
        )
