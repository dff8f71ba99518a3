"""The llama.cpp memory model: bytes per device for weights, KV cache, recurrent state, compute
buffers and runtime overhead. Pure arithmetic on a :class:`ModelInfo` and :class:`Settings`.

How exact each part is (``tests/planner`` checks them against real llama.cpp loads):

* **KV cache** and **recurrent state** (:mod:`homelab.planner.cache`): byte for byte.
* **Weights** (:mod:`homelab.planner.placement`): the GGUF tensor sizes, placed by llama.cpp's
  rules; exact for a file, as good as the catalogue's synthetic tensors otherwise.
* **Compute** (:mod:`homelab.planner.compute`): a structural formula calibrated on CPU dry
  runs (within 5% or 0.5 MiB for the demo models); on CUDA an estimate until a dry run there
  confirms it.
* **Overhead**: per GPU the CUDA context, cuBLAS workspace and pool (the GPU profile's
  measured default, overridable); on the host the logits output buffer.

Each layer's KV cache and recurrent state live on the device holding that layer (llama.cpp's
``offload_kqv`` default).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from homelab.gguf.model import ModelInfo
from homelab.planner.budget import Device, Hardware
from homelab.planner.cache import kv_bytes_by_layer, recurrent_bytes_by_layer
from homelab.planner.compute import GraphPart, compute_bytes, graph_facts
from homelab.planner.geometry import cache_geometry
from homelab.planner.placement import layer_devices, offload_split, unused_devices, weight_table
from homelab.planner.projector import ProjectorCost
from homelab.settings import Settings

F32 = 4


@dataclass(frozen=True)
class MemoryPart:
    """One part of what a device holds: ``label`` as bars and legends show it, ``key`` as the
    plan's JSON names it (``{key}_bytes``)."""

    key: str
    label: str
    size_bytes: int


@dataclass(frozen=True)
class DeviceMemory:
    """What one device holds under a plan, in bytes."""

    name: str
    kind: str
    label: str
    budget_bytes: int
    weights_bytes: int
    kv_bytes: int
    recurrent_bytes: int
    compute_bytes: int
    overhead_bytes: int
    draft_bytes: int = 0  # the speculative draft's weights, KV, compute and logits here
    projector_bytes: int = 0  # the vision projector's weights and warm-up compute buffer here

    def parts(self) -> tuple[MemoryPart, ...]:
        """Every part of the device's total, in the order bars stack them: the one list the
        plan's bar, the dashboard's bars and legends, and the JSON read."""
        return (
            MemoryPart("weights", "weights", self.weights_bytes),
            MemoryPart("kv", "KV", self.kv_bytes),
            MemoryPart("recurrent", "recurrent", self.recurrent_bytes),
            MemoryPart("compute", "compute", self.compute_bytes),
            MemoryPart("overhead", "overhead", self.overhead_bytes),
            MemoryPart("draft", "draft", self.draft_bytes),
            MemoryPart("projector", "projector", self.projector_bytes),
        )

    @property
    def total_bytes(self) -> int:
        return sum(part.size_bytes for part in self.parts())

    @property
    def headroom_bytes(self) -> int:
        return self.budget_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "label": self.label,
            "budget_bytes": self.budget_bytes,
            **{f"{part.key}_bytes": part.size_bytes for part in self.parts()},
            "total_bytes": self.total_bytes,
        }


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-device memory of one configuration; the host (CPU) first. With a speculative
    draft, ``draft`` is the draft's own estimate (each device's ``draft_bytes`` sums it)."""

    devices: tuple[DeviceMemory, ...]
    draft: MemoryEstimate | None = None

    @property
    def draft_bytes(self) -> int:
        return sum(d.draft_bytes for d in self.devices)

    @property
    def projector_bytes(self) -> int:
        return sum(d.projector_bytes for d in self.devices)

    @property
    def weights_bytes(self) -> int:
        return sum(d.weights_bytes for d in self.devices)

    @property
    def kv_bytes(self) -> int:
        return sum(d.kv_bytes for d in self.devices)

    @property
    def recurrent_bytes(self) -> int:
        return sum(d.recurrent_bytes for d in self.devices)

    @property
    def compute_bytes(self) -> int:
        return sum(d.compute_bytes for d in self.devices)

    @property
    def overhead_bytes(self) -> int:
        return sum(d.overhead_bytes for d in self.devices)

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    @property
    def tightest(self) -> DeviceMemory:
        """The device closest to (or furthest over) its budget."""
        return min(self.devices, key=lambda d: d.headroom_bytes / max(d.budget_bytes, 1))

    def device(self, name: str) -> DeviceMemory:
        return next(d for d in self.devices if d.name == name)

    def to_dict(self) -> dict[str, object]:
        sums: dict[str, int] = {}
        for device in self.devices:
            for part in device.parts():
                sums[f"{part.key}_bytes"] = sums.get(f"{part.key}_bytes", 0) + part.size_bytes
        document: dict[str, object] = {
            **sums,
            "total_bytes": self.total_bytes,
            "devices": [d.to_dict() for d in self.devices],
        }
        if self.draft is not None:
            document["draft"] = self.draft.to_dict()
        return document


class MemoryModel:
    """A model's memory facts, computed once so that a search can estimate many settings fast."""

    def __init__(
        self,
        model: ModelInfo,
        compute_correction: dict[str, int] | None = None,
        draft: MemoryModel | None = None,
        projector: ProjectorCost | None = None,
    ) -> None:
        self.model = model
        self.draft = draft  # the speculative draft loaded beside this model, if any
        self.projector = projector  # the vision projector loaded with it, if any
        self.geometry = cache_geometry(model)
        self.facts = graph_facts(model)
        self.weights = weight_table(model)
        # bytes to add to a device's formula compute buffer (from a dry run that measured it)
        self.compute_correction = dict(compute_correction or {})

    @property
    def n_layer(self) -> int:
        return self.model.n_layer

    @property
    def full_offload_layers(self) -> int:
        """``n_gpu_layers`` that puts every block and the output head on the GPU."""
        return self.model.n_layer + 1

    def layer_placement(self, settings: Settings, hardware: Hardware) -> tuple[int, ...]:
        n_gpu_layers = settings.n_gpu_layers if hardware.has_gpu else 0
        split = offload_split(hardware.gpu_split(), settings.split_mode, settings.main_gpu)
        return layer_devices(self.n_layer, n_gpu_layers, split)

    def without_draft(self) -> MemoryModel:
        if self.draft is None:
            return self
        return MemoryModel(self.model, self.compute_correction, projector=self.projector)

    def with_projector(self, projector: ProjectorCost | None) -> MemoryModel:
        return MemoryModel(self.model, self.compute_correction, self.draft, projector)

    def estimate(self, settings: Settings, hardware: Hardware) -> MemoryEstimate:
        own = self._estimate(settings, hardware)
        if self.draft is None:
            return own
        from homelab.planner.draft import draft_settings

        draft = self.draft.estimate(draft_settings(settings, self.draft.model), hardware)
        devices = tuple(
            replace(device, draft_bytes=draft_share(drafted))
            for device, drafted in zip(own.devices, draft.devices, strict=True)
        )
        return MemoryEstimate(devices, draft)

    def _estimate(self, settings: Settings, hardware: Hardware) -> MemoryEstimate:
        placement = self.layer_placement(settings, hardware)
        n_cpu_moe = settings.n_cpu_moe if hardware.has_gpu else 0
        count = len(hardware.devices)
        weights = self.weights.by_device(placement, n_cpu_moe, count)
        kv = self._per_device(kv_bytes_by_layer(self.geometry, settings), placement, count)
        recurrent = self._per_device(
            recurrent_bytes_by_layer(self.geometry, settings), placement, count
        )
        compute = self._compute(settings, hardware, placement, n_cpu_moe)
        unused = unused_devices(count, settings.split_mode, settings.main_gpu)
        devices = tuple(
            DeviceMemory(
                name=device.name,
                kind=device.kind,
                label=device.label,
                budget_bytes=device.budget_bytes,
                weights_bytes=weights[index],
                kv_bytes=kv[index],
                recurrent_bytes=recurrent[index],
                compute_bytes=compute[index] + self.compute_correction.get(device.name, 0),
                overhead_bytes=self._overhead(device, settings),
            )
            if index not in unused
            else _left_out(device)
            for index, device in enumerate(hardware.devices)
        )
        return MemoryEstimate(self._with_projector(devices, hardware))

    def _with_projector(
        self, devices: tuple[DeviceMemory, ...], hardware: Hardware
    ) -> tuple[DeviceMemory, ...]:
        """The projector on the first local GPU (when it is offloaded), else the host."""
        if self.projector is None:
            return devices
        index = projector_device(hardware, self.projector.on_gpu)
        cost = self.projector.total_bytes
        return tuple(
            replace(d, projector_bytes=cost) if i == index else d for i, d in enumerate(devices)
        )

    @staticmethod
    def _per_device(sizes: dict[int, int], placement: tuple[int, ...], count: int) -> list[int]:
        totals = [0] * count
        for layer, n_bytes in sizes.items():
            totals[placement[layer]] += n_bytes
        return totals

    def _compute(
        self, settings: Settings, hardware: Hardware, placement: tuple[int, ...], n_cpu_moe: int
    ) -> list[int]:
        count = len(hardware.devices)
        if count == 1:
            return [compute_bytes(self.facts, settings)]
        totals = []
        for index in range(count):
            part = GraphPart(
                layers=frozenset(il for il in range(self.n_layer) if placement[il] == index),
                has_output=placement[-1] == index,
                has_input=index == 0,
            )
            device = hardware.devices[index]
            local_gpu = index > 0 and device.endpoint is None
            totals.append(compute_bytes(self.facts, settings, part, cuda=local_gpu))
        # op offload: big batches on CPU-resident weights run on the first local GPU, which
        # then holds a copy of the largest such tensor in its compute buffer (RPC devices
        # do not take offloaded ops)
        unused = unused_devices(count, settings.split_mode, settings.main_gpu)
        first_gpu = next(
            (
                i
                for i, d in enumerate(hardware.devices)
                if i > 0 and d.endpoint is None and i not in unused
            ),
            None,
        )
        if first_gpu is not None:
            totals[first_gpu] += self.weights.largest_cpu_tensor_bytes(placement, n_cpu_moe)
        return totals

    def _overhead(self, device: Device, settings: Settings) -> int:
        if device.kind == "gpu":
            return device.overhead_bytes
        return F32 * self.model.n_vocab * settings.n_parallel  # logits output buffer


def projector_device(hardware: Hardware, on_gpu: bool) -> int:
    """The device index a projector goes on: mtmd takes the first GPU, else the host."""
    if not on_gpu:
        return 0
    gpus = (i for i, d in enumerate(hardware.devices) if d.kind == "gpu" and d.endpoint is None)
    return next(gpus, 0)


def _left_out(device: Device) -> DeviceMemory:
    """A device llama.cpp does not use (``--split-mode none``, not the main device)."""
    return DeviceMemory(device.name, device.kind, device.label, device.budget_bytes, 0, 0, 0, 0, 0)


def draft_share(device: DeviceMemory) -> int:
    """What a draft adds to a device: all but a GPU's runtime overhead (one per process)."""
    overhead = device.overhead_bytes if device.kind != "gpu" else 0
    return device.total_bytes - device.overhead_bytes + overhead


def estimate_memory(model: ModelInfo, settings: Settings, hardware: Hardware) -> MemoryEstimate:
    """Per-device memory of ``model`` loaded with ``settings`` on ``hardware``."""
    return MemoryModel(model).estimate(settings, hardware)
