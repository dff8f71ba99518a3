"""The Live run panel: decode/prefill tok/s with sparklines, TTFT, slots, queue, KV cells;
and each time the GPU was given back (cause, time to yield, bytes freed and saved, time to
resume)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from homelab.engine.api import EngineMetrics
from homelab.tui.format import HIDDEN, rate, seconds
from homelab.tui.widgets.bars import LIGHT_SHADE, Segment, StackedBar
from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.server.yielding import YieldEvent

HISTORY_POINTS = 60
NOT_LOADED = (
    "No model loaded. Press [b]ctrl+l[/b] to load it, or just ask in the chat (it loads first)."
)
KV_USED_STYLE = "#af87ff"
KV_FREE_STYLE = "#4e4e4e"
YIELDS_SHOWN = 3  # the last yields listed under the numbers


class RateView(Horizontal):
    """A label, a big number and a sparkline of its recent history."""

    DEFAULT_CSS = """
    RateView { height: 1; }
    RateView .rate-label { width: 9; color: $text-muted; }
    RateView .rate-value { width: 16; text-style: bold; }
    RateView Sparkline { width: 1fr; height: 1; }
    """

    def __init__(self, label: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.label = label
        self.history: deque[float] = deque(maxlen=HISTORY_POINTS)
        self.value = Static("–", classes="rate-value")
        self.sparkline = Sparkline([], summary_function=max)

    def compose(self) -> ComposeResult:
        yield Static(self.label, classes="rate-label")
        yield self.value
        yield self.sparkline

    def push(self, value_tok_s: float, *, frozen: bool) -> None:
        self.history.append(value_tok_s)
        value = HIDDEN if frozen else rate(value_tok_s)
        self.value.update(f"{value} tok/s")
        self.sparkline.data = [] if frozen else list(self.history)


class LivePanel(Vertical):
    """Fed with :class:`EngineMetrics` at the engine's steady rate (coalesced by the app)."""

    DEFAULT_CSS = """
    LivePanel #live-state { height: auto; color: $text-muted; }
    LivePanel #live-counts, LivePanel #live-kv { height: 1; }
    LivePanel #kv-bar { height: 1; }
    LivePanel .metric { display: none; }
    LivePanel.-running .metric { display: block; }
    LivePanel #live-spec { height: 1; display: none; }
    LivePanel.-running.-speculating #live-spec { display: block; }
    LivePanel #live-yields { height: auto; color: $text-muted; display: none; }
    LivePanel.-yielded-before #live-yields { display: block; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Live run"
        self.latest: EngineMetrics | None = None
        self.state = Static(NOT_LOADED, id="live-state")
        self.decode = RateView("decode", id="decode-rate", classes="metric")
        self.prefill = RateView("prefill", id="prefill-rate", classes="metric")
        self.counts = Static(id="live-counts", classes="metric")
        self.kv_line = Static(id="live-kv", classes="metric")
        self.kv_bar = StackedBar(id="kv-bar", classes="metric")
        self.spec_line = Static(id="live-spec")  # only while the engine speculates
        self.yields = Static(id="live-yields")  # empty until the GPU is first given back

    def compose(self) -> ComposeResult:
        yield self.state
        yield self.decode
        yield self.prefill
        yield self.counts
        yield self.spec_line
        yield self.kv_line
        yield self.kv_bar
        yield self.yields

    def show_state(self, text: str) -> None:
        self.state.update(text)

    def show_unloaded(self) -> None:
        self.latest = None
        self.remove_class("-running", "-speculating")
        self.show_state(NOT_LOADED)

    def show_yielded(self, text: str) -> None:
        """The GPU is given back: no numbers, the state and what resumes."""
        self.latest = None
        self.remove_class("-running", "-speculating")
        self.show_state(f"[b $warning]{escape(text)}[/]")

    def show_yields(self, events: list[YieldEvent], *, frozen: bool) -> None:
        lines = [yield_text(event, frozen=frozen) for event in events[-YIELDS_SHOWN:]]
        self.yields.update("\n".join(lines))
        self.set_class(bool(lines), "-yielded-before")

    def show_metrics(self, metrics: EngineMetrics, *, frozen: bool) -> None:
        self.latest = metrics
        self.add_class("-running")
        self.decode.push(metrics.decode_tok_s, frozen=frozen)
        self.prefill.push(metrics.prefill_tok_s, frozen=frozen)
        self.counts.update(counts_text(metrics, frozen=frozen))
        self.set_class(metrics.speculation is not None, "-speculating")
        if metrics.speculation is not None:
            self.spec_line.update(speculation_text(metrics, frozen=frozen))
        self.kv_line.update(
            f"[b]KV cells[/b] {metrics.kv_cells_used:,} of {metrics.kv_cells_total:,} used"
        )
        self.kv_bar.update(
            [
                Segment("used", metrics.kv_cells_used, KV_USED_STYLE),
                Segment(
                    "free",
                    max(metrics.kv_cells_total - metrics.kv_cells_used, 0),
                    KV_FREE_STYLE,
                    LIGHT_SHADE,
                ),
            ]
        )


def speculation_text(metrics: EngineMetrics, *, frozen: bool) -> str:
    """ "speculation ngram · 72% of drafted tokens accepted · 2.40 tokens per target step"."""
    kept = f"{metrics.accepted_draft_tokens_total:,} of {metrics.draft_tokens_total:,}"
    if frozen:
        acceptance = per_step = kept = HIDDEN
    else:
        rate_ = metrics.acceptance_rate
        acceptance = "–" if rate_ is None else f"{rate_:.0%}"
        step = metrics.tokens_per_target_step
        per_step = "–" if step is None else f"{step:.2f}"
    return (
        f"[b]speculation[/b] {metrics.speculation} · {acceptance} of drafted tokens accepted · "
        f"{per_step} tokens per target step  [dim]{kept} drafted kept[/]"
    )


def counts_text(metrics: EngineMetrics, *, frozen: bool) -> str:
    ttft = HIDDEN if frozen else seconds(metrics.last_ttft_s)
    finished = ", ".join(
        f"{key} {value}" for key, value in sorted(metrics.requests_by_status.items())
    )
    return (
        f"[b]TTFT[/b] {ttft} · [b]slots[/b] {metrics.active_slots}/{metrics.n_slots} active · "
        f"[b]queue[/b] {metrics.queue_depth} · [b]requests[/b] {metrics.requests_total}"
        + (f" [dim]({finished})[/]" if finished else "")
    )


def yield_text(event: YieldEvent, *, frozen: bool) -> str:
    """ "yield (asked): 0.03 s · freed 36.5 MiB planned, RSS 36.5 MiB, VRAM n/a · 2 states
    saved (1.2 MiB) · yielded 12.0 s · resumed in 0.7 s"."""
    vram = "n/a" if event.vram_freed_bytes is None else format_size(event.vram_freed_bytes)
    rss = HIDDEN if frozen else format_size(event.rss_freed_bytes)
    saved = f"{event.saved_states} states saved ({format_size(event.saved_bytes)})"
    text = (
        f"[b]yield[/b] ({escape(event.cause)}): {_took(event.yield_s, frozen)} · freed "
        f"{format_size(event.planned_bytes)} planned, RSS {rss}, VRAM {vram} · {saved}"
    )
    if event.resume_s is not None and event.yielded_s is not None:
        text += (
            f" · yielded {_took(event.yielded_s, frozen)} · resumed in "
            f"{_took(event.resume_s, frozen)}"
        )
    elif event.resume_error:
        text += f" · [b $error]resume failed:[/] {escape(event.resume_error)}"
    return text


def _took(value_s: float, frozen: bool) -> str:
    return HIDDEN if frozen else f"{value_s:.2f} s"
