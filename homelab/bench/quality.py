"""The quality cost of a configuration, measured against a reference on a text.

Every configuration reads the same text in chunks of ``n_ctx`` tokens (the first token of
each chunk replaced by BOS, like llama.cpp's ``llama-perplexity``). Each chunk is one
``llama_decode`` with an output for every position, so llama.cpp returns the next-token
logits everywhere; the first half of a chunk is context only, the second half is scored:

- KL(reference || candidate) of the next-token distributions: mean, p99 and max;
- top-1 agreement: how often both put the same token first;
- perplexity of the text under each.

The reference and every candidate run chunk by chunk side by side, so only one chunk of
log-probabilities per configuration is held at a time (a 32k vocabulary × 512 positions is
64 MiB in float32), never the whole text's. Models are loaded once per weights file and
shared by the contexts that use them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from homelab.errors import BenchError, ModelFileError
from homelab.llamacpp.backend import supports_gpu_offload
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context, ContextCreateError, ContextParams
from homelab.llamacpp.model import ALL_LAYERS, Model, ModelLoadError, ModelParams

DEFAULT_CTX = 512
BUNDLED_TEXT = Path(__file__).with_name("sample_text.txt")
BUNDLED_TEXT_NAME = "bundled sample (homelab/bench/sample_text.txt)"

Progress = Callable[[int, int], None]  # (steps done, steps in all)


@dataclass(frozen=True)
class QualityConfig:
    """One way to run the model: which weights file, which K/V cache types."""

    label: str  # e.g. "reference", "plan", "K/V q8_0"
    model_path: str
    quant: str  # the weights file's quant label
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True

    @property
    def key(self) -> tuple[str, str, str, bool]:
        return (self.model_path, self.type_k, self.type_v, self.flash_attn)

    def describe(self) -> str:
        kv = self.type_k if self.type_k == self.type_v else f"K {self.type_k} / V {self.type_v}"
        attention = "flash attention" if self.flash_attn else "no flash attention"
        return f"{self.quant} weights, {kv} K/V cache, {attention}"


@dataclass(frozen=True)
class QualityRow:
    """How far one configuration is from the reference."""

    config: QualityConfig
    kld_mean: float
    kld_p99: float
    kld_max: float
    top1_agreement: float  # 0..1
    perplexity: float
    is_plan: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.config.label,
            "config": _config_dict(self.config),
            "kld_mean": self.kld_mean,
            "kld_p99": self.kld_p99,
            "kld_max": self.kld_max,
            "top1_agreement": self.top1_agreement,
            "perplexity": self.perplexity,
            "is_plan": self.is_plan,
        }


@dataclass(frozen=True)
class QualityResult:
    """A quality measurement: the reference, the rows compared with it, and on what text."""

    model_name: str
    text_source: str
    n_ctx: int
    n_chunks: int
    n_text_tokens: int
    n_scored_tokens: int
    reference: QualityConfig
    reference_perplexity: float
    rows: tuple[QualityRow, ...]
    elapsed_s: float
    measured_at: str = ""  # ISO 8601, set when saved
    hardware_id: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def plan_row(self) -> QualityRow | None:
        return next((row for row in self.rows if row.is_plan), None)

    def summary(self) -> str:
        """One line for the TUI, next to the plan."""
        row = self.plan_row or (self.rows[0] if self.rows else None)
        if row is None:
            return "no quality result"
        delta = perplexity_change(row.perplexity, self.reference_perplexity)
        return (
            f"KLD {row.kld_mean:.4f} (p99 {row.kld_p99:.4f}), top-1 "
            f"{row.top1_agreement:.1%}, ppl {delta:+.2%} vs {self.reference.quant} f16 K/V"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "text_source": self.text_source,
            "n_ctx": self.n_ctx,
            "n_chunks": self.n_chunks,
            "n_text_tokens": self.n_text_tokens,
            "n_scored_tokens": self.n_scored_tokens,
            "reference": _config_dict(self.reference),
            "reference_perplexity": self.reference_perplexity,
            "rows": [row.to_dict() for row in self.rows],
            "elapsed_s": self.elapsed_s,
            "measured_at": self.measured_at,
            "hardware_id": self.hardware_id,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QualityResult:
        rows = tuple(
            QualityRow(
                config=QualityConfig(**row["config"]),
                kld_mean=float(row["kld_mean"]),
                kld_p99=float(row["kld_p99"]),
                kld_max=float(row["kld_max"]),
                top1_agreement=float(row["top1_agreement"]),
                perplexity=float(row["perplexity"]),
                is_plan=bool(row.get("is_plan", False)),
            )
            for row in data["rows"]
        )
        return cls(
            model_name=str(data["model_name"]),
            text_source=str(data["text_source"]),
            n_ctx=int(data["n_ctx"]),
            n_chunks=int(data["n_chunks"]),
            n_text_tokens=int(data["n_text_tokens"]),
            n_scored_tokens=int(data["n_scored_tokens"]),
            reference=QualityConfig(**data["reference"]),
            reference_perplexity=float(data["reference_perplexity"]),
            rows=rows,
            elapsed_s=float(data["elapsed_s"]),
            measured_at=str(data.get("measured_at", "")),
            hardware_id=str(data.get("hardware_id", "")),
            notes=tuple(data.get("notes", ())),
        )


def _config_dict(config: QualityConfig) -> dict[str, Any]:
    return {
        "label": config.label,
        "model_path": config.model_path,
        "quant": config.quant,
        "type_k": config.type_k,
        "type_v": config.type_v,
        "flash_attn": config.flash_attn,
    }


def perplexity_change(perplexity: float, reference_perplexity: float) -> float:
    """Relative change, e.g. 0.004 for +0.4 %."""
    return perplexity / reference_perplexity - 1.0 if reference_perplexity else 0.0


def read_text(path: Path | None) -> tuple[str, str]:
    """(text, where it came from): ``path``, or the bundled sample when None."""
    source = BUNDLED_TEXT if path is None else Path(path).expanduser()
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise BenchError(
            f"cannot read the text {source}: {error}", hint="Give a UTF-8 text file with --text."
        ) from error
    return text, BUNDLED_TEXT_NAME if path is None else str(source)


# --- statistics (pure numpy, tested on their own) ----------------------------------------


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of (positions, vocab) float32 logits; sums in float64."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=1, keepdims=True, dtype=np.float64))
    return (shifted - log_sum).astype(np.float32)


def kl_divergence(reference_lp: np.ndarray, candidate_lp: np.ndarray) -> np.ndarray:
    """KL(reference || candidate) per row, from log-probabilities; rounding noise below 0 → 0."""
    terms = np.exp(reference_lp) * (reference_lp - candidate_lp)
    return np.maximum(terms.sum(axis=1, dtype=np.float64), 0.0)


def target_nll(log_probs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of ``targets[i]`` under row ``i``."""
    return -log_probs[np.arange(len(targets)), targets]


@dataclass
class _Tally:
    """Per-position figures of one configuration, collected chunk by chunk."""

    kld: list[np.ndarray] = field(default_factory=list)
    agree: list[np.ndarray] = field(default_factory=list)
    nll: list[np.ndarray] = field(default_factory=list)

    def add(self, reference_lp: np.ndarray, candidate_lp: np.ndarray, targets: np.ndarray) -> None:
        self.kld.append(kl_divergence(reference_lp, candidate_lp))
        self.agree.append(reference_lp.argmax(axis=1) == candidate_lp.argmax(axis=1))
        self.nll.append(target_nll(candidate_lp, targets))

    def row(self, config: QualityConfig, is_plan: bool) -> QualityRow:
        kld = np.concatenate(self.kld)
        return QualityRow(
            config=config,
            kld_mean=float(kld.mean()),
            kld_p99=float(np.percentile(kld, 99)),
            kld_max=float(kld.max()),
            top1_agreement=float(np.concatenate(self.agree).mean()),
            perplexity=perplexity(self.nll),
            is_plan=is_plan,
        )


def perplexity(nll_chunks: Sequence[np.ndarray]) -> float:
    return float(np.exp(np.concatenate(nll_chunks).mean(dtype=np.float64)))


# --- llama.cpp ---------------------------------------------------------------------------


class _Evaluator:
    """One llama.cpp context that returns next-token log-probabilities for a whole chunk."""

    def __init__(self, model: Model, config: QualityConfig, n_ctx: int) -> None:
        try:
            self.context = Context.create(model, _context_params(config, n_ctx))
        except ContextCreateError as error:
            raise BenchError(
                f"llama.cpp could not create a context for {config.describe()}: {error.reason}",
                hint="Quantized K/V caches need head sizes divisible by 32; try --kv f16.",
            ) from None
        self.batch = Batch(n_ctx)

    def log_probs(self, tokens: Sequence[int], first: int) -> np.ndarray:
        """Log-probabilities of the next token at positions ``first`` .. ``len(tokens) - 2``."""
        self.context.memory.clear()
        self.batch.clear()
        self.batch.add_run(tokens, 0, 0, output_all=True)
        status = self.context.decode(self.batch)
        if status != 0:
            raise BenchError(f"llama_decode failed (status {status}) while measuring quality")
        return log_softmax(self.context.all_logits(len(tokens))[first:-1])

    def close(self) -> None:
        self.batch.close()
        self.context.close()


def _context_params(config: QualityConfig, n_ctx: int) -> ContextParams:
    """One sequence whose every position is an output, in one ubatch."""
    return ContextParams(
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_seq_max=1,
        type_k=config.type_k,
        type_v=config.type_v,
        flash_attn=config.flash_attn,
    )


@contextmanager
def _loaded_models(paths: Sequence[str]) -> Iterator[dict[str, Model]]:
    """Each distinct weights file loaded once (CPU or as llama.cpp's defaults place it)."""
    params = ModelParams(n_gpu_layers=ALL_LAYERS if supports_gpu_offload() else 0)
    with ExitStack() as stack:
        models = {
            path: stack.enter_context(_load_model(path, params)) for path in dict.fromkeys(paths)
        }
        yield models


def _load_model(path: str, params: ModelParams) -> Model:
    if not Path(path).is_file():
        raise ModelFileError(path, "file not found", hint="Check the path or run `homelab models`.")
    try:
        return Model.load(path, params)
    except ModelLoadError as error:
        raise ModelFileError(
            path,
            f"llama.cpp could not load it: {error.reason}",
            hint="The reference and the plan's weights are loaded together; if both do not fit "
            "in memory, pass a smaller --reference (or the plan's own file).",
        ) from None


def tokenize(model: Model, text: str) -> list[int]:
    """The text's tokens (no BOS, special tokens not parsed)."""
    return model.vocab.tokenize(text, add_bos=False, parse_special=False)


def chunks(
    tokens: Sequence[int], n_ctx: int, bos: int | None, max_chunks: int | None
) -> list[list[int]]:
    """Whole chunks of ``n_ctx`` tokens; the first token of each becomes BOS when there is one."""
    count = len(tokens) // n_ctx
    if max_chunks is not None:
        count = min(count, max_chunks)
    result = []
    for index in range(count):
        chunk = list(tokens[index * n_ctx : (index + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        result.append(chunk)
    return result


def _bos(model: Model) -> int | None:
    return model.vocab.bos if model.vocab.adds_bos else None


# --- the measurement ---------------------------------------------------------------------


def measure_quality(
    reference: QualityConfig,
    candidates: Sequence[QualityConfig],
    text: str,
    *,
    model_name: str,
    text_source: str = BUNDLED_TEXT_NAME,
    plan_key: tuple[str, str, str, bool] | None = None,
    n_ctx: int = DEFAULT_CTX,
    max_chunks: int | None = None,
    progress: Progress | None = None,
) -> QualityResult:
    """Compare every candidate with the reference on ``text``; ``plan_key`` marks the plan's row."""
    started = time.perf_counter()
    paths = [reference.model_path, *(c.model_path for c in candidates)]
    with _loaded_models(paths) as models, ExitStack() as stack:
        reference_model = models[reference.model_path]
        _require_same_vocabulary(models)
        tokens = tokenize(reference_model, text)
        pieces = chunks(tokens, n_ctx, _bos(reference_model), max_chunks)
        if not pieces:
            raise BenchError(
                f"the text has {len(tokens)} tokens, fewer than one chunk of {n_ctx}",
                hint="Give a longer text with --text, or a smaller --ctx.",
            )
        evaluators = [
            _open(stack, models[c.model_path], c, n_ctx) for c in (reference, *candidates)
        ]
        reference_nll, tallies = _run_chunks(pieces, evaluators, n_ctx, progress)
    rows = tuple(
        tally.row(config, is_plan=config.key == plan_key)
        for tally, config in zip(tallies, candidates, strict=True)
    )
    return QualityResult(
        model_name=model_name,
        text_source=text_source,
        n_ctx=n_ctx,
        n_chunks=len(pieces),
        n_text_tokens=len(tokens),
        n_scored_tokens=sum(len(n) for n in reference_nll),
        reference=reference,
        reference_perplexity=perplexity(reference_nll),
        rows=rows,
        elapsed_s=time.perf_counter() - started,
    )


def _open(stack: ExitStack, model: Model, config: QualityConfig, n_ctx: int) -> _Evaluator:
    evaluator = _Evaluator(model, config, n_ctx)
    stack.callback(evaluator.close)
    return evaluator


def _run_chunks(
    pieces: list[list[int]], evaluators: list[_Evaluator], n_ctx: int, progress: Progress | None
) -> tuple[list[np.ndarray], list[_Tally]]:
    reference, candidates = evaluators[0], evaluators[1:]
    first = n_ctx // 2  # positions before this are context only
    tallies = [_Tally() for _ in candidates]
    reference_nll: list[np.ndarray] = []
    total, done = len(pieces) * len(evaluators), 0
    for chunk in pieces:
        targets = np.asarray(chunk[first + 1 :])
        reference_lp = reference.log_probs(chunk, first)
        reference_nll.append(target_nll(reference_lp, targets))
        done = _tick(progress, done + 1, total)
        for evaluator, tally in zip(candidates, tallies, strict=True):
            tally.add(reference_lp, evaluator.log_probs(chunk, first), targets)
            done = _tick(progress, done + 1, total)
    return reference_nll, tallies


def _tick(progress: Progress | None, done: int, total: int) -> int:
    if progress is not None:
        progress(done, total)
    return done


def _require_same_vocabulary(models: dict[str, Model]) -> None:
    sizes = {path: model.vocab.n_tokens for path, model in models.items()}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{Path(p).name}: {n}" for p, n in sizes.items())
        raise BenchError(
            f"the weights files have different vocabularies ({listed})",
            hint="Compare files of the same model only (pass --reference explicitly).",
        )


# --- which configurations to compare -----------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    reference: QualityConfig
    candidates: tuple[QualityConfig, ...]
    plan_key: tuple[str, str, str, bool]
    notes: tuple[str, ...]


def plan_comparison(
    model_path: str,
    quant: str,
    type_k: str,
    type_v: str,
    flash_attn: bool,
    *,
    reference_path: str,
    reference_quant: str,
    kv_types: Sequence[str],
) -> Comparison:
    """The plan, and the plan's weights with each K/V type, against the reference: the most
    precise weights with an f16 cache (flash attention on, as llama.cpp's default picks)."""
    reference = QualityConfig("reference", reference_path, reference_quant, "f16", "f16", True)
    plan = QualityConfig("plan", model_path, quant, type_k, type_v, flash_attn)
    candidates: dict[tuple[str, str, str, bool], QualityConfig] = {plan.key: plan}
    notes = []
    for kv in kv_types:
        config = QualityConfig(f"K/V {kv}", model_path, quant, kv, kv, True)
        if config.key == reference.key:
            notes.append(f"{config.label} on {quant} weights is the reference itself (KLD 0).")
        elif config.key != plan.key:
            candidates[config.key] = config
    return Comparison(reference, tuple(candidates.values()), plan.key, tuple(notes))
