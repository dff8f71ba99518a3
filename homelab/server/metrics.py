"""Server counters and the Prometheus text exposition of them and of the engine's snapshot.

Counters and the TTFT histogram are updated from the server's event loop; ``render`` turns
them plus an :class:`~homelab.engine.api.EngineMetrics` snapshot into the text format
(version 0.0.4) that Prometheus scrapes.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from homelab.engine.api import EngineMetrics, RequestStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last is +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str) -> Iterable[str]:
        """Exposition lines; ``labels`` is rendered label text such as ``model="x"``."""
        cumulative = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            cumulative += count
            yield f'{name}_bucket{{{labels},le="{_format_bound(bound)}"}} {cumulative}'
        yield f"{name}_sum{{{labels}}} {_format_value(self.total)}"
        yield f"{name}_count{{{labels}}} {self.n}"


class ServerMetrics:
    """What the server itself counts (the engine reports the rest)."""

    def __init__(self) -> None:
        self.responses: Counter[tuple[str, int]] = Counter()  # (route, status)
        self.ttft_s = Histogram(TTFT_BUCKETS_S)
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.cancelled = 0

    def observe_response(self, route: str, status: int) -> None:
        self.responses[(route, status)] += 1

    def observe_generation(self, stats: RequestStats) -> None:
        if stats.completion_tokens:
            self.ttft_s.observe(stats.ttft_s)
        self.prompt_tokens += stats.prompt_tokens
        self.cached_tokens += stats.cached_tokens
        self.completion_tokens += stats.completion_tokens

    def observe_client_gone(self) -> None:
        self.cancelled += 1

    def render(self, engine: EngineMetrics | None, model: str) -> str:
        out = _Exposition(model)
        self._render_server(out)
        if engine is not None:
            _render_engine(out, engine)
        out.gauge(
            "homelab_model_loaded",
            "1 when the model is loaded and serving",
            int(engine is not None),
        )
        return out.text()

    def _render_server(self, out: _Exposition) -> None:
        out.header("homelab_http_responses_total", "counter", "HTTP responses by route and status")
        for (route, status), count in sorted(self.responses.items()):
            out.sample("homelab_http_responses_total", count, route=route, status=str(status))
        out.header(
            "homelab_time_to_first_token_seconds", "histogram", "request start to first token"
        )
        for line in self.ttft_s.lines("homelab_time_to_first_token_seconds", out.model_label):
            out.raw(line)
        out.counter("homelab_prompt_tokens_total", "prompt tokens processed", self.prompt_tokens)
        out.counter(
            "homelab_cached_prompt_tokens_total",
            "prompt tokens reused from cache",
            self.cached_tokens,
        )
        out.counter(
            "homelab_completion_tokens_total", "completion tokens generated", self.completion_tokens
        )
        out.counter(
            "homelab_cancelled_requests_total", "generations cancelled by clients", self.cancelled
        )


def _render_engine(out: _Exposition, m: EngineMetrics) -> None:
    out.gauge("homelab_decode_tokens_per_second", "rolling decode throughput", m.decode_tok_s)
    out.gauge("homelab_prefill_tokens_per_second", "rolling prefill throughput", m.prefill_tok_s)
    out.gauge("homelab_slots_active", "slots generating now", m.active_slots)
    out.gauge("homelab_slots_total", "parallel slots", m.n_slots)
    out.gauge("homelab_queue_depth", "requests waiting for a slot", m.queue_depth)
    out.gauge("homelab_kv_cells_used", "KV cache cells in use", m.kv_cells_used)
    out.gauge("homelab_kv_cells_total", "KV cache cells", m.kv_cells_total)
    usage = m.kv_cells_used / m.kv_cells_total if m.kv_cells_total else 0.0
    out.gauge("homelab_kv_usage_ratio", "fraction of KV cells in use", usage)
    out.header("homelab_engine_requests_total", "counter", "engine requests by final status")
    for status, count in sorted(m.requests_by_status.items()):
        out.sample("homelab_engine_requests_total", count, status=status)
    if m.speculation is not None:
        _render_speculation(out, m)
    if m.step_phases_us is not None:
        _render_step_phases(out, m.step_phases_us)


def _render_step_phases(out: _Exposition, phases_us: Mapping[str, float]) -> None:
    """Only for an engine that profiles its steps (``HOMELAB_PROFILE_STEPS=1``)."""
    out.header("homelab_step_phase_seconds", "gauge", "mean seconds per scheduler step, by phase")
    for phase, micros in phases_us.items():
        out.sample("homelab_step_phase_seconds", micros / 1e6, phase=phase)


def _render_speculation(out: _Exposition, m: EngineMetrics) -> None:
    """Only for an engine that speculates (``--spec ngram`` / ``--draft``)."""
    out.counter(
        "homelab_draft_tokens_total", "drafted tokens the model verified", m.draft_tokens_total
    )
    out.counter(
        "homelab_accepted_draft_tokens_total",
        "drafted tokens the model kept",
        m.accepted_draft_tokens_total,
    )
    if m.acceptance_rate is not None:
        out.gauge(
            "homelab_draft_acceptance_ratio",
            "rolling share of drafted tokens kept",
            m.acceptance_rate,
        )
    if m.tokens_per_target_step is not None:
        out.gauge(
            "homelab_tokens_per_target_step",
            "rolling tokens a generating sequence gains per model step (1: no speculation)",
            m.tokens_per_target_step,
        )


class _Exposition:
    def __init__(self, model: str) -> None:
        self._lines: list[str] = []
        self._model = model

    def header(self, name: str, kind: str, help_text: str) -> None:
        self._lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: str) -> None:
        all_labels = {"model": self._model, **labels}
        rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in all_labels.items())
        self._lines.append(f"{name}{{{rendered}}} {_format_value(value)}")

    @property
    def model_label(self) -> str:
        return f'model="{_escape(self._model)}"'

    def raw(self, line: str) -> None:
        self._lines.append(line)

    def gauge(self, name: str, help_text: str, value: float) -> None:
        self.header(name, "gauge", help_text)
        self.sample(name, value)

    def counter(self, name: str, help_text: str, value: float) -> None:
        self.header(name, "counter", help_text)
        self.sample(name, value)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _format_bound(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


def render_fleet(server: ServerMetrics, fleet: Any) -> str:
    """Several models (a :class:`homelab.server.fleet.Fleet`): the HTTP counters once, then
    each model's counters, engine gauges and residency, labelled ``model``."""
    out = _Exposition("")
    out.header("homelab_http_responses_total", "counter", "HTTP responses by route and status")
    for (route, status), count in sorted(server.responses.items()):
        rendered = f'route="{_escape(route)}",status="{status}"'
        out.raw(f"homelab_http_responses_total{{{rendered}}} {count}")
    families: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for model in list(fleet.models.values()):
        engine = model.engine
        block = _Exposition(model.name)
        model.metrics._render_server(block)
        if engine is not None:
            _render_engine(block, engine.metrics())
        block.gauge("homelab_model_loaded", "1 when the model is loaded", int(engine is not None))
        planned = model.plan.memory.total_bytes if model.plan is not None else 0
        block.gauge("homelab_model_planned_bytes", "memory the plan gives the model", planned)
        block.gauge(
            "homelab_model_actual_bytes",
            "memory llama.cpp allocated",
            sum(model.actual_bytes.values()),
        )
        block.gauge(
            "homelab_model_requests_in_flight", "requests holding the model", model.in_flight
        )
        block.counter(
            "homelab_model_loads_total", "loads of the model", fleet.loads_total.get(model.name, 0)
        )
        block.counter(
            "homelab_model_evictions_total",
            "unloads to make room for another model",
            fleet.evictions_total.get(model.name, 0),
        )
        _merge(block.text(), families, samples, skip="homelab_http_responses_total")
    for name, header in families.items():
        if name == "homelab_http_responses_total":
            continue  # written once, above
        for line in (*header, *samples[name]):
            out.raw(line)
    return out.text()


def _merge(
    text: str, families: dict[str, list[str]], samples: dict[str, list[str]], skip: str
) -> None:
    """Add one model's exposition to the families (each family's header written once)."""
    current = ""
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            current = line.split(" ", 3)[2]
            header = families.setdefault(current, [])
            samples.setdefault(current, [])
            if len(header) < 2:
                header.append(line)
        elif line and current != skip:
            samples[current].append(line)
