"""Terminal output of ``homelab bench`` and ``homelab quality``: tables, a chart, progress.

Everything here turns result objects into rich renderables; nothing measures. The progress
bar writes to stderr (stdout stays one JSON document with ``--json``) and only when stderr is
a terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, Group, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from homelab.bench.concurrency import ConcurrencyTable, LevelResult
from homelab.bench.profile import SpeedResult, Spread
from homelab.bench.quality import QualityResult, QualityRow, perplexity_change
from homelab.bench.speculative import SpeculationResult
from homelab.settings import Settings
from homelab.units import format_mib

KV_STYLES = {"f16": "cyan", "q8_0": "green", "q4_0": "magenta"}
CHART_WIDTH = 40


# --- progress ----------------------------------------------------------------------------


class Ticker:
    """Moves a progress bar: ``ticker(what)`` for one more step, ``ticker.set(done, total)``."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self._progress = progress
        self._task = task

    def __call__(self, what: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, last=what)

    def set(self, done: int, total: int, what: str = "") -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=total, last=what)


@contextmanager
def progress_bar(total: int | None, title: str, *, enabled: bool | None = None) -> Iterator[Ticker]:
    """A bar on stderr (only when it is a terminal); ``total`` None until it is known."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield Ticker()
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        yield Ticker(progress, progress.add_task(title, total=total, last=""))


# --- formatting helpers ------------------------------------------------------------------


def tok_s(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"


def mib(n_bytes: int | None) -> str:
    return "—" if n_bytes is None else format_mib(n_bytes)


def kv_label(settings: Settings) -> str:
    if settings.type_k == settings.type_v:
        return settings.type_k
    return f"K {settings.type_k} / V {settings.type_v}"


def settings_line(settings: Settings) -> str:
    attention = ", flash attention" if settings.flash_attn else ""
    return (
        f"{settings.quant} weights, K/V {kv_label(settings)}{attention}, "
        f"{settings.n_parallel} slot(s) × {settings.n_ctx_per_slot} tokens, "
        f"{settings.n_gpu_layers} GPU layers"
    )


# --- bench -------------------------------------------------------------------------------


def speed_table(result: SpeedResult) -> Table:
    table = Table(
        title=f"Speed of the planned configuration ({result.repetitions} runs after a warm-up)",
        caption=settings_line(result.settings),
        title_justify="left",
    )
    table.add_column("test")
    table.add_column("median tok/s", justify="right")
    table.add_column("min – max", justify="right")
    table.add_column("spread", justify="right")
    for label, spread in (
        (result.pp_label, result.prefill_tok_s),
        (result.tg_label, result.decode_tok_s),
    ):
        table.add_row(label, tok_s(spread.median), _range(spread), f"±{spread.relative_spread:.1%}")
    return table


def speculation_table(result: SpeculationResult) -> Table:
    table = Table(
        title=f"Speculative decoding: {result.label} "
        f"(tg{result.generated_tokens}, {result.repetitions} interleaved runs after a warm-up)",
        caption="Only the plain figures go into the hardware profile.",
        title_justify="left",
    )
    table.add_column("decode")
    table.add_column("median tok/s", justify="right")
    table.add_column("min – max", justify="right")
    table.add_column("vs plain", justify="right")
    table.add_column("accepted", justify="right")
    table.add_column("tokens/step", justify="right")
    table.add_row("plain", tok_s(result.plain_tok_s.median), _range(result.plain_tok_s), "", "", "")
    acceptance = result.acceptance_rate
    per_step = result.tokens_per_target_step
    table.add_row(
        result.kind,
        tok_s(result.speculative_tok_s.median),
        _range(result.speculative_tok_s),
        f"{result.ratio:.2f}×",
        "—" if acceptance is None else f"{acceptance:.0%}",
        "—" if per_step is None else f"{per_step:.2f}",
    )
    return table


def _range(spread: Spread) -> str:
    return f"{tok_s(spread.low)} – {tok_s(spread.high)}"


def concurrency_table(table: ConcurrencyTable) -> Table:
    budget = f", budget {mib(table.budget_bytes)}" if table.budget_bytes else ""
    out = Table(
        title=(
            f"Concurrency × K/V type: {table.n_ctx_per_request} tokens of context per request, "
            f"{table.prompt_tokens}-token prompts, {table.generated_tokens} generated{budget}"
        ),
        caption=(
            f"median of {table.repeats} run(s) per cell; "
            "TTFT includes waiting for the other requests' prefill"
        ),
        title_justify="left",
    )
    for name, justify in (
        ("K/V", "left"),
        ("requests", "right"),
        ("memory (planned)", "right"),
        ("aggregate tok/s", "right"),
        ("per stream tok/s", "right"),
        ("TTFT p50", "right"),
        ("TTFT p95", "right"),
    ):
        out.add_column(name, justify=justify)  # type: ignore[arg-type]
    for kv_type in table.kv_types:
        for level in table.levels:
            cell = table.cell(kv_type, level)
            if cell is not None:
                out.add_row(*_cell_row(cell), style=KV_STYLES.get(kv_type))
        out.add_section()
    return out


def _cell_row(cell: LevelResult) -> list[str]:
    head = [cell.kv_type, str(cell.concurrency), mib(cell.predicted_bytes)]
    if not cell.fits:
        return [*head, "does not fit", "", "", ""]
    return [
        *head,
        tok_s(cell.aggregate_decode_tok_s),
        tok_s(cell.mean_stream_decode_tok_s),
        seconds(cell.ttft_p50_s),
        seconds(cell.ttft_p95_s),
    ]


def concurrency_chart(table: ConcurrencyTable, width: int = CHART_WIDTH) -> Group:
    """Horizontal bars of aggregate decode tok/s, grouped by concurrency, one per K/V type."""
    values = [c.aggregate_decode_tok_s or 0.0 for c in table.cells]
    peak = max(values, default=0.0) or 1.0
    lines = [Text("aggregate decode tok/s vs concurrency", style="bold")]
    label_width = max((len(kv) for kv in table.kv_types), default=4)
    for level in table.levels:
        for index, kv_type in enumerate(table.kv_types):
            cell = table.cell(kv_type, level)
            if cell is None:
                continue
            prefix = f"{level:>4} " if index == 0 else " " * 5
            lines.append(_chart_line(prefix, kv_type.ljust(label_width), cell, peak, width))
    return Group(*lines)


def _chart_line(prefix: str, label: str, cell: LevelResult, peak: float, width: int) -> Text:
    line = Text(prefix)
    line.append(label + " ", style=KV_STYLES.get(cell.kv_type))
    if not cell.fits:
        return line.append("does not fit", style="dim")
    value = cell.aggregate_decode_tok_s or 0.0
    line.append(_bar(value / peak, width), style=KV_STYLES.get(cell.kv_type))
    return line.append(f" {tok_s(value)}")


def _bar(fraction: float, width: int) -> str:
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[rest].strip()
    return "█" * full + partial


def bench_report(
    speed: SpeedResult | None,
    table: ConcurrencyTable | None,
    profile_path: str | None,
    warning: str | None = None,
    speculation: SpeculationResult | None = None,
) -> list[RenderableType]:
    parts: list[RenderableType] = []
    if speed is not None:
        parts.append(speed_table(speed))
    if speculation is not None:
        parts.append(speculation_table(speculation))
    if table is not None:
        parts += [concurrency_table(table), concurrency_chart(table)]
    if warning:
        parts.append(Text(warning, style="yellow"))
    if profile_path:
        parts.append(
            Text(
                f"Saved the hardware profile to {profile_path}; "
                "`homelab plan` now predicts tok/s from it.",
                style="dim",
            )
        )
    return parts


# --- quality -----------------------------------------------------------------------------


def quality_table(result: QualityResult) -> Table:
    reference = result.reference
    table = Table(
        title=(
            f"Quality cost vs {reference.quant} weights with an f16 K/V cache "
            f"({result.n_scored_tokens} tokens scored, chunks of {result.n_ctx})"
        ),
        caption=(
            f"text: {result.text_source}; reference perplexity "
            f"{result.reference_perplexity:,.4g}; {result.elapsed_s:.0f} s"
        ),
        title_justify="left",
    )
    table.add_column("")
    table.add_column("weights")
    table.add_column("K/V")
    for name in ("KLD mean", "KLD p99", "top-1 =", "ppl", "Δ ppl"):
        table.add_column(name, justify="right")
    for row in result.rows:
        cells = _quality_cells(row, result.reference_perplexity)
        table.add_row(*cells, style="bold" if row.is_plan else None)
    return table


def _quality_cells(row: QualityRow, reference_perplexity: float) -> list[str]:
    config = row.config
    kv = config.type_k if config.type_k == config.type_v else f"{config.type_k}/{config.type_v}"
    if not config.flash_attn:
        kv += " (no FA)"
    return [
        "plan" if row.is_plan else "",
        config.quant,
        kv,
        f"{row.kld_mean:.6f}",
        f"{row.kld_p99:.6f}",
        f"{row.top1_agreement:.2%}",
        f"{row.perplexity:,.4g}",
        f"{perplexity_change(row.perplexity, reference_perplexity):+.3%}",
    ]


def quality_report(result: QualityResult, saved_path: str | None) -> list[RenderableType]:
    parts: list[RenderableType] = [quality_table(result)]
    parts += [Text(note, style="yellow") for note in result.notes]
    if saved_path:
        parts.append(
            Text(f"Saved to {saved_path}; the dashboard shows it next to the plan.", style="dim")
        )
    return parts


def print_all(parts: list[RenderableType], console: Console | None = None) -> None:
    console = console or Console()
    for part in parts:
        console.print(part)
