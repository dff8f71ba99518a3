"""The Hardware panel: each GPU's VRAM (ours / other processes / free) and sensors; CPU, RAM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from homelab.hardware.gpu import GpuInfo, GpuSnapshot
from homelab.hardware.report import HardwareReport
from homelab.tui.format import HIDDEN, shown
from homelab.tui.hardware_source import LiveHardware, vram_share
from homelab.tui.widgets.bars import LIGHT_SHADE, Segment, StackedBar
from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.tui.services import WorkerLine

OURS_STYLE = "bold #5fafff"
OTHER_STYLE = "#d7875f"
FREE_STYLE = "#4e4e4e"
RAM_USED_STYLE = "#87af87"


def vram_segments(snapshot: GpuSnapshot) -> list[Segment]:
    share = vram_share(snapshot)
    return [
        Segment("ours", share.ours_bytes, OURS_STYLE),
        Segment("other", share.other_bytes, OTHER_STYLE),
        Segment("free", share.free_bytes, FREE_STYLE, LIGHT_SHADE),
    ]


def vram_legend(snapshot: GpuSnapshot) -> str:
    share = vram_share(snapshot)
    ours = format_size(share.ours_bytes, digits=1) if share.ours_known else "0 B"
    return (
        f"[{OURS_STYLE}]■[/] ours {ours}  "
        f"[{OTHER_STYLE}]■[/] other processes {format_size(share.other_bytes, digits=1)}  "
        f"[dim]░[/] free {format_size(share.free_bytes, digits=1)}"
    )


def sensors_line(snapshot: GpuSnapshot, *, frozen: bool) -> str:
    if frozen:
        return f"[dim]{HIDDEN} °C · {HIDDEN} W · util {HIDDEN}[/]"
    power = "N/A" if snapshot.power_draw_w is None else f"{snapshot.power_draw_w:.0f}"
    limit = "" if snapshot.power_limit_w is None else f"/{snapshot.power_limit_w:.0f}"
    return (
        f"{shown(snapshot.temperature_c, ' °C')} · {power}{limit} W · "
        f"util {shown(snapshot.utilization_gpu_percent, '%')}"
    )


class GpuView(Vertical):
    """One GPU: name and sensors, the VRAM bar, its legend."""

    DEFAULT_CSS = """
    GpuView { height: auto; }
    GpuView .gpu-title { height: 1; }
    GpuView .legend { height: 1; color: $text-muted; }
    """

    def __init__(self, gpu: GpuInfo) -> None:
        super().__init__(id=f"gpu-{gpu.index}")
        self.gpu = gpu
        self.title = Static(classes="gpu-title")
        self.bar = StackedBar(classes="vram-bar")
        self.legend = Static(classes="legend")

    def compose(self) -> ComposeResult:
        yield self.title
        yield self.bar
        yield self.legend

    def show(self, snapshot: GpuSnapshot, *, frozen: bool) -> None:
        total = format_size(snapshot.memory_total_bytes, digits=1)
        unified = " (unified with RAM)" if snapshot.unified_memory else ""
        self.title.update(
            f"[b]GPU {self.gpu.index}[/b] {escape(self.gpu.name)} · {total}{unified}  "
            f"[dim]{sensors_line(snapshot, frozen=frozen)}[/]"
        )
        self.bar.update(vram_segments(snapshot))
        self.legend.update(vram_legend(snapshot))


class HardwarePanel(Vertical):
    """Fed by the app: :meth:`show_report` once, :meth:`show_live` about once a second."""

    DEFAULT_CSS = """
    HardwarePanel #gpus, HardwarePanel #no-gpu { height: auto; }
    HardwarePanel #host, HardwarePanel #ram-line { height: 1; }
    HardwarePanel #hw-warnings { height: auto; color: $warning; }
    HardwarePanel #rpc-workers { height: auto; display: none; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Hardware"
        self.report: HardwareReport | None = None
        self.gpus = Vertical(id="gpus")
        self.gpu_views: dict[int, GpuView] = {}  # by GPU index
        self.no_gpu = Static("detecting hardware…", id="no-gpu")
        self.host = Static(id="host")
        self.ram_line = Static(id="ram-line")
        self.ram_bar = StackedBar(id="ram-bar")
        self.worker_list = Static(id="rpc-workers")
        self.warnings = Static(id="hw-warnings")

    def compose(self) -> ComposeResult:
        yield self.gpus
        yield self.no_gpu
        yield self.host
        yield self.ram_line
        yield self.ram_bar
        yield self.worker_list
        yield self.warnings

    def show_workers(self, workers: tuple[WorkerLine, ...]) -> None:
        """The ``--rpc`` workers' devices (hidden without workers)."""
        self.worker_list.update("\n".join(worker_text(worker) for worker in workers))
        self.worker_list.display = bool(workers)

    async def show_report(self, report: HardwareReport) -> None:
        self.report = report
        await self.gpus.remove_children()
        self.gpu_views = {gpu.index: GpuView(gpu) for gpu in report.gpus}
        await self.gpus.mount_all(self.gpu_views.values())
        self.no_gpu.update(no_gpu_text(report))
        self.no_gpu.display = not report.gpus
        self.host.update(host_text(report))
        self.warnings.update(warnings_text(report))
        self.border_subtitle = build_text(report)

    def show_live(self, live: LiveHardware, *, frozen: bool) -> None:
        for snapshot in live.gpus:
            view = self.gpu_views.get(snapshot.index)
            if view is not None:
                view.show(snapshot, frozen=frozen)
        used = max(live.ram_total_bytes - live.ram_available_bytes, 0)
        cpu = HIDDEN if frozen or live.cpu_percent is None else f"{live.cpu_percent:.0f}%"
        self.ram_line.update(
            f"[b]RAM[/b] {format_size(used, digits=1)} used of "
            f"{format_size(live.ram_total_bytes, digits=1)} · "
            f"{format_size(live.ram_available_bytes, digits=1)} available  [dim]CPU load {cpu}[/]"
        )
        self.ram_bar.update(
            [
                Segment("used", used, RAM_USED_STYLE),
                Segment("available", live.ram_available_bytes, FREE_STYLE, LIGHT_SHADE),
            ]
        )


def worker_text(worker: WorkerLine) -> str:
    """ "worker 127.0.0.1:50052 · RPC0 · 23.5 GiB free of 31.2 GiB" (then "· budget 8.0 GiB"
    with ``--rpc-budget``), or why it is unreachable."""
    where = f"[b]worker[/b] {escape(worker.endpoint)}"
    if worker.device is None:
        return f"{where} · [b $error]{escape(worker.problem)}[/]"
    device = escape(worker.device.partition("[")[0])
    budget = worker.budget_bytes
    return (
        f"{where} · {device} · {format_size(worker.free_bytes, digits=1)} free "
        f"[dim]of {format_size(worker.total_bytes, digits=1)}[/]"
        + ("" if budget is None else f" · budget {format_size(budget, digits=1)}")
    )


def no_gpu_text(report: HardwareReport) -> str:
    reason = report.reason or "no GPU was found."
    return f"[b $warning]No GPU — running on the CPU only.[/]\n[dim]{escape(reason)}[/]"


def host_text(report: HardwareReport) -> str:
    cpu = report.cpu
    cores = f"{shown(cpu.physical_cores)} cores / {shown(cpu.logical_cores)} threads"
    features = "AVX-512" if cpu.has_avx512 else ("AVX2" if cpu.has_avx2 else "no AVX2")
    return f"[b]CPU[/b] {escape(cpu.model)} · {cores} · {features}"


def build_text(report: HardwareReport) -> str:
    build = report.build
    if build.error is not None:
        return "llama.cpp not loadable"
    names = list(build.backends)
    if build.cuda and build.cuda_version:  # "CUDA 13.5 sm_89": what it was compiled for
        archs = ",".join(f"sm_{arch}" for arch in build.cuda_architectures)
        names[names.index("CUDA")] = f"CUDA {build.cuda_version} {archs}".rstrip()
    return f"llama.cpp {shown(build.version)} · {', '.join(names) or '?'}"


def warnings_text(report: HardwareReport) -> str:
    return "\n".join(f"⚠ {escape(warning)}" for warning in report.warnings)
