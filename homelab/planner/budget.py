"""The devices a plan must fit on and each one's memory budget.

A budget is what the plan may use on a device, overheads included:

* a detected GPU: its free VRAM (NVML, at planning time) minus a margin;
* a GPU profile (``--gpu rtx-4090``, planning for hardware that isn't here): its VRAM minus a
  desktop reserve (the display and desktop apps) minus the margin;
* ``--vram BYTES``: those bytes minus the margin;
* the host: available RAM (or ``--ram``) minus a host margin;
* a device of a llama.cpp RPC worker (``--rpc HOST:PORT``): the free memory the worker reports
  minus the margin, or ``--rpc-budget``. Remote devices come right after the host, in the
  order given: llama.cpp puts RPC devices first in its split.

Each GPU also carries its runtime overhead (CUDA context, cuBLAS workspace, pool), taken from
its profile when there is one (``profiles/gpus.toml``), else :data:`DEFAULT_GPU_OVERHEAD_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from homelab.errors import ConfigError, PlanError
from homelab.units import GIB, MIB, format_gib

if TYPE_CHECKING:
    from homelab.hardware.profiles import GpuProfile
    from homelab.hardware.report import HardwareReport

DEFAULT_MARGIN_BYTES = 256 * MIB  # left free on every GPU
DESKTOP_RESERVE_BYTES = 768 * MIB  # a profile GPU also drives a display and desktop apps
DEFAULT_GPU_OVERHEAD_BYTES = 512 * MIB  # llama.cpp users measure 0.3-0.75 GiB
HOST_MARGIN_BYTES = 1 * GIB  # left for the OS and this process besides the model
DEFAULT_CPU_BANDWIDTH_GB_S = 50.0  # dual-channel DDR4/DDR5 desktop, what a roofline assumes
DEFAULT_GPU_BANDWIDTH_GB_S = 500.0  # only for --vram without a profile

DeviceKind = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class Device:
    """One place memory lives: the host (``CPU``) or a GPU (``CUDA0``…)."""

    name: str  # llama.cpp's backend name: "CPU", "CUDA0", ...
    kind: DeviceKind
    label: str  # what the user recognises: "GeForce RTX 4090 (profile rtx-4090)"
    total_bytes: int
    budget_bytes: int
    bandwidth_gb_s: float
    overhead_bytes: int  # runtime memory besides weights, caches and compute buffers
    budget_note: str  # how budget_bytes was derived
    compute_capability: str | None = None
    free_bytes: int | None = None  # what llama.cpp will see free; GPUs share layers by it
    fp16_tflops: float | None = None  # dense tensor-core FP16 (profile), for prefill estimates
    hardware_id: str | None = None  # profile id or NVML name: keys measured speed profiles
    endpoint: str | None = None  # the RPC worker ("HOST:PORT") holding this device, if remote


@dataclass(frozen=True)
class Hardware:
    """The host first, then the GPUs, as llama.cpp will see them."""

    devices: tuple[Device, ...]
    source: str  # "detected", "profile", "vram" or "cpu"
    notes: tuple[str, ...] = field(default=())

    @property
    def cpu(self) -> Device:
        return self.devices[0]

    @property
    def gpus(self) -> tuple[Device, ...]:
        return self.devices[1:]

    @property
    def has_gpu(self) -> bool:
        return len(self.devices) > 1

    def gpu_split(self) -> tuple[float, ...]:
        """How llama.cpp shares layers between GPUs by default: in proportion to free memory.
        Remote devices (no ``free_bytes``) share by their budgets."""
        return tuple(float(gpu.free_bytes or gpu.budget_bytes) for gpu in self.gpus)

    @property
    def has_remote(self) -> bool:
        return any(d.endpoint for d in self.gpus)

    @property
    def rpc_endpoints(self) -> tuple[str, ...]:
        """The RPC workers the plan uses, in llama.cpp's device order."""
        return tuple(dict.fromkeys(d.endpoint for d in self.gpus if d.endpoint))

    def tensor_split(self) -> tuple[float, ...]:
        """The split the loader passes to llama.cpp so that it allocates what was planned:
        explicit whenever several devices (GPUs, RPC workers) share the layers — free memory
        at load time may differ from planning time. Empty (llama.cpp's default) for one."""
        return self.gpu_split() if len(self.gpus) > 1 or self.rpc_endpoints else ()


def with_workers(
    hardware: Hardware,
    endpoints: tuple[str, ...],
    budget_bytes: int | None = None,
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
) -> Hardware:
    """``hardware`` with every device of each RPC worker, queried now (an unreachable or
    incompatible worker is an error naming it); ``budget_bytes`` caps each remote device."""
    if not endpoints:
        return hardware
    from dataclasses import replace

    from homelab.llamacpp.rpc import probe

    remote = []
    for endpoint in endpoints:
        for device in probe(endpoint).devices:
            remote.append(remote_device(device, budget_bytes, margin_bytes))
    devices = (hardware.cpu, *remote, *hardware.gpus)
    workers = ", ".join(endpoints)
    notes = (*hardware.notes, f"RPC workers {workers}: their devices come first in the split.")
    return replace(hardware, devices=devices, notes=notes)


def remote_device(device: object, budget_bytes: int | None, margin_bytes: int) -> Device:
    """One device of an RPC worker as the planner sees it (a WorkerDevice from the doorway)."""
    from homelab.llamacpp.rpc import WorkerDevice

    assert isinstance(device, WorkerDevice)
    free = device.free_bytes
    if budget_bytes is None:
        budget, note = max(free - margin_bytes, 0), f"minus {_gib(margin_bytes)} margin"
    else:
        budget, note = min(budget_bytes, free), "capped by --rpc-budget"
    return Device(
        name=device.buffer_name,
        kind="gpu",  # llama.cpp offloads layers to an RPC device as to a GPU
        label=f"worker {device.endpoint} · device {device.index} · {_gib(free)} free",
        total_bytes=device.total_bytes,
        budget_bytes=budget,
        bandwidth_gb_s=DEFAULT_CPU_BANDWIDTH_GB_S,  # unknown backend: assume host memory
        overhead_bytes=0,
        budget_note=f"{_gib(free)} free on the worker {note}",
        endpoint=device.endpoint,
        hardware_id="rpc",
    )


def host_device(ram_bytes: int, note: str, total_bytes: int | None = None) -> Device:
    budget = max(ram_bytes - HOST_MARGIN_BYTES, 0)
    return Device(
        name="CPU",
        kind="cpu",
        label="host RAM",
        total_bytes=total_bytes if total_bytes is not None else ram_bytes,
        budget_bytes=budget,
        bandwidth_gb_s=DEFAULT_CPU_BANDWIDTH_GB_S,
        overhead_bytes=0,
        budget_note=f"{note} minus {_gib(HOST_MARGIN_BYTES)} for the system",
        hardware_id="cpu",
    )


def profile_gpu(
    profile: GpuProfile, index: int = 0, margin_bytes: int = DEFAULT_MARGIN_BYTES
) -> Device:
    budget = profile.vram_bytes - DESKTOP_RESERVE_BYTES - margin_bytes
    return Device(
        name=f"CUDA{index}",
        kind="gpu",
        label=f"{profile.name} (profile {profile.id})",
        total_bytes=profile.vram_bytes,
        budget_bytes=_positive_budget(budget, profile.name),
        bandwidth_gb_s=profile.bandwidth_gb_s,
        overhead_bytes=profile.overhead_bytes,
        budget_note=(
            f"{_gib(profile.vram_bytes)} VRAM minus {_gib(DESKTOP_RESERVE_BYTES)} desktop "
            f"reserve minus {_gib(margin_bytes)} margin"
        ),
        compute_capability=profile.compute_capability,
        free_bytes=profile.vram_bytes - DESKTOP_RESERVE_BYTES,
        fp16_tflops=profile.fp16_tflops,
        hardware_id=profile.id,
    )


def vram_gpu(vram_bytes: int, margin_bytes: int = DEFAULT_MARGIN_BYTES) -> Device:
    return Device(
        name="CUDA0",
        kind="gpu",
        label=f"GPU with {_gib(vram_bytes)}",
        total_bytes=vram_bytes,
        budget_bytes=_positive_budget(vram_bytes - margin_bytes, "--vram"),
        bandwidth_gb_s=DEFAULT_GPU_BANDWIDTH_GB_S,
        overhead_bytes=DEFAULT_GPU_OVERHEAD_BYTES,
        budget_note=f"{_gib(vram_bytes)} given with --vram minus {_gib(margin_bytes)} margin",
        free_bytes=vram_bytes,
    )


def hardware_from_report(
    report: HardwareReport, margin_bytes: int = DEFAULT_MARGIN_BYTES, ram_bytes: int | None = None
) -> Hardware:
    """This machine as detected: free VRAM per GPU (if llama.cpp can use them) and free RAM."""
    host = _host_from_report(report, ram_bytes)
    notes = []
    gpus: list[Device] = []
    if report.gpus and report.build.cpu_only:
        notes.append("llama.cpp is built for CPU only: planning for the CPU, ignoring the GPUs.")
    elif report.gpus:
        for gpu in report.gpus:
            device = _detected_gpu(gpu, len(gpus), margin_bytes)
            if device.budget_bytes <= device.overhead_bytes:
                notes.append(f"{device.label} has almost no free VRAM: planning without it.")
                continue
            gpus.append(device)
    return Hardware((host, *gpus), "detected" if gpus else "cpu", tuple(notes))


def _host_from_report(report: HardwareReport, ram_bytes: int | None) -> Device:
    if ram_bytes is not None:
        return host_device(ram_bytes, f"{_gib(ram_bytes)} given with --ram")
    memory = report.memory
    available = memory.ram_available_bytes
    if memory.cgroup_limit_bytes is not None:
        available = min(available, memory.cgroup_limit_bytes)
    return host_device(available, f"{_gib(available)} RAM available", memory.ram_total_bytes)


def _detected_gpu(gpu: object, index: int, margin_bytes: int) -> Device:
    from homelab.hardware.gpu import GpuInfo
    from homelab.planner.calibration import measured_gpu_overhead

    assert isinstance(gpu, GpuInfo)
    profile = _profile_or_none(gpu.profile_id)
    free = gpu.memory_free_bytes
    measured = measured_gpu_overhead(gpu.index)
    overhead = profile.overhead_bytes if profile else DEFAULT_GPU_OVERHEAD_BYTES
    return Device(
        name=f"CUDA{index}",
        kind="gpu",
        label=gpu.name,
        total_bytes=gpu.memory_total_bytes,
        budget_bytes=max(free - margin_bytes, 0),
        bandwidth_gb_s=profile.bandwidth_gb_s if profile else DEFAULT_GPU_BANDWIDTH_GB_S,
        overhead_bytes=overhead if measured is None else measured,
        budget_note=f"{_gib(free)} free now (NVML) minus {_gib(margin_bytes)} margin"
        + ("" if measured is None else "; overhead measured by earlier loads"),
        compute_capability=gpu.compute_capability,
        free_bytes=free,
        fp16_tflops=profile.fp16_tflops if profile else None,
        hardware_id=profile.id if profile else gpu.name,
    )


def _profile_or_none(profile_id: str | None) -> GpuProfile | None:
    if profile_id is None:
        return None
    from homelab.hardware.profiles import find_gpu_profile

    try:
        return find_gpu_profile(profile_id)
    except ConfigError:
        return None


def resolve_hardware(
    gpu: str | None = None,
    vram_bytes: int | None = None,
    ram_bytes: int | None = None,
    margin_bytes: int | None = None,
    gpu_overhead_bytes: int | None = None,
) -> Hardware:
    """The hardware a plan is for: a profile (``--gpu``), a size (``--vram``) or this machine."""
    margin = DEFAULT_MARGIN_BYTES if margin_bytes is None else margin_bytes
    if gpu is not None and vram_bytes is not None:
        raise PlanError("Give either --gpu or --vram, not both.")
    if gpu is not None or vram_bytes is not None:
        hardware = _offline_hardware(gpu, vram_bytes, ram_bytes, margin)
    else:
        from homelab.hardware.report import detect

        hardware = hardware_from_report(detect(), margin, ram_bytes)
    return with_gpu_overhead(hardware, gpu_overhead_bytes)


def _offline_hardware(
    gpu: str | None, vram_bytes: int | None, ram_bytes: int | None, margin: int
) -> Hardware:
    from homelab.hardware.host import read_memory

    if ram_bytes is None:
        memory = read_memory()
        host = host_device(memory.ram_total_bytes, f"{_gib(memory.ram_total_bytes)} RAM here")
    else:
        host = host_device(ram_bytes, f"{_gib(ram_bytes)} given with --ram")
    if gpu is not None:
        from homelab.hardware.profiles import find_gpu_profile

        device, source = profile_gpu(find_gpu_profile(gpu), 0, margin), "profile"
    else:
        assert vram_bytes is not None
        device, source = vram_gpu(vram_bytes, margin), "vram"
    return Hardware((host, device), source)


def with_gpu_overhead(hardware: Hardware, overhead_bytes: int | None) -> Hardware:
    if overhead_bytes is None:
        return hardware
    from dataclasses import replace

    devices = tuple(
        replace(d, overhead_bytes=overhead_bytes) if d.kind == "gpu" else d
        for d in hardware.devices
    )
    return replace(hardware, devices=devices)


def _positive_budget(budget: int, what: str) -> int:
    if budget <= 0:
        raise PlanError(
            f"{what} leaves no memory to plan with after the reserve and margin.",
            hint="Lower --margin or free some VRAM.",
        )
    return budget


def _gib(n_bytes: int) -> str:
    return format_gib(n_bytes)


RESERVED_NOTE_PREFIX = "set aside on the host:"  # render.py shows these notes under Memory
PROMPT_CACHE_RAM_SHARE = 0.10  # of the host budget, for saved prompt states by default
PROMPT_CACHE_RAM_MAX_BYTES = 8 * GIB  # llama-server's --cache-ram default


def default_prompt_cache_bytes(hardware: Hardware) -> int:
    """The RAM ``serve`` keeps for saved prompt states unless told: a share of the host's
    budget, at most :data:`PROMPT_CACHE_RAM_MAX_BYTES`."""
    share = int(hardware.cpu.budget_bytes * PROMPT_CACHE_RAM_SHARE)
    return min(share, PROMPT_CACHE_RAM_MAX_BYTES)


def reserve_host(hardware: Hardware, n_bytes: int, what: str) -> Hardware:
    """``hardware`` with ``n_bytes`` of host RAM set aside for ``what`` (the plan never uses
    them, and shows why in the host's budget note)."""
    if n_bytes <= 0:
        return hardware
    from dataclasses import replace

    host = hardware.cpu
    budget = host.budget_bytes - n_bytes
    if budget <= 0:
        raise ConfigError(
            f"{what} ({format_gib(n_bytes)}) takes all of the host's "
            f"{format_gib(host.budget_bytes)}.",
            hint="Lower --prompt-cache-ram-mib, or pass --no-prompt-cache.",
        )
    note = f"{host.budget_note} minus {format_gib(n_bytes)} for {what}"
    shown = f"{RESERVED_NOTE_PREFIX} {format_gib(n_bytes)} for {what} (not planned)"
    devices = (replace(host, budget_bytes=budget, budget_note=note), *hardware.gpus)
    return replace(hardware, devices=devices, notes=(*hardware.notes, shown))


def cpu_only(hardware: Hardware) -> Hardware:
    """``hardware`` without its GPUs and RPC devices: a plan for the host alone (no layer
    offloaded), e.g. to keep serving while the GPU is given to another program."""
    from dataclasses import replace

    note = "planning for the CPU only: the GPUs are left to other programs"
    return replace(hardware, devices=(hardware.cpu,), source="cpu", notes=(*hardware.notes, note))
