"""Predicted speed of a plan: a bandwidth roofline until measured data exists.

Decode is memory-bound: every generated token reads the active weights (all dense weights,
``n_expert_used / n_expert`` of the routed experts) and the sequence's KV cache once, from
whichever device holds them. Predicted decode tok/s is ``1 / Σ bytes_read / (bandwidth ×
efficiency)`` over the devices. Prefill is compute-bound: ``2 × active parameters`` FLOPs per
token at a fraction of the device's FP16 rate; weights left on the CPU are also copied to the
GPU once per ubatch (llama.cpp's op offload) over PCIe.

Measured profiles replace the roofline: :func:`load_measured_profile` reads JSON files that
``homelab bench`` writes to ``data_dir()/profiles/*.json``, each one object (or a list of them)
with the keys::

    {"model_name": "Llama 3.1 8B Instruct",  # ModelInfo.name (general.name)
     "quant": "Q4_K_M",                       # Settings.quant
     "type_k": "f16",                         # Settings.type_k
     "hardware_id": "rtx-4090",               # GPU profile id, NVML name, or "cpu"
     "decode_tok_s": 127.5,                   # single-stream decode
     "prefill_tok_s": 5400.0}

A profile matches when model name, quant, KV type and hardware id are equal (names compared
case-insensitively); then ``basis`` is ``"measured"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from homelab.locations import data_dir
from homelab.planner.budget import Hardware
from homelab.planner.cache import context_shape, kv_bytes_by_layer
from homelab.planner.memory import MemoryModel
from homelab.settings import Settings

BANDWIDTH_EFFICIENCY = 0.75  # llama.cpp decode reaches ~70-85% of peak bandwidth
GPU_FLOPS_EFFICIENCY = 0.35  # of the dense FP16 tensor-core rate, for quantized matmuls
CPU_EFFECTIVE_TFLOPS = 1.0  # a desktop CPU's prefill rate with llama.cpp's kernels
PCIE_BANDWIDTH_GB_S = 25.0  # PCIe 4.0 x16 in practice
TYPICAL_FILL_TOKENS = 4096  # decode is quoted at this much context (or the slot size)


@dataclass(frozen=True)
class MeasuredSpeed:
    decode_tok_s: float
    prefill_tok_s: float
    source: str  # the file it came from


@dataclass(frozen=True)
class Prediction:
    decode_tok_s: float  # one stream, at ``context_fill`` tokens of context
    prefill_tok_s: float
    basis: str  # "roofline" or "measured"
    context_fill: int
    decode_tok_s_full_context: float  # one stream with its slot's context full
    detail: str

    def to_dict(self) -> dict[str, object]:
        return {
            "decode_tok_s": round(self.decode_tok_s, 1),
            "prefill_tok_s": round(self.prefill_tok_s, 1),
            "basis": self.basis,
            "context_fill": self.context_fill,
            "decode_tok_s_full_context": round(self.decode_tok_s_full_context, 1),
            "detail": self.detail,
        }


def predict_speed(memory: MemoryModel, settings: Settings, hardware: Hardware) -> Prediction:
    measured = load_measured_profile(memory.model.name, settings, hardware)
    fill = min(settings.n_ctx_per_slot, TYPICAL_FILL_TOKENS)
    full = roofline_decode_tok_s(memory, settings, hardware, settings.n_ctx_per_slot)
    if measured is not None:
        return Prediction(
            decode_tok_s=measured.decode_tok_s,
            prefill_tok_s=measured.prefill_tok_s,
            basis="measured",
            context_fill=fill,
            decode_tok_s_full_context=full,
            detail=f"measured by homelab bench ({measured.source})",
        )
    return Prediction(
        decode_tok_s=roofline_decode_tok_s(memory, settings, hardware, fill),
        prefill_tok_s=roofline_prefill_tok_s(memory, settings, hardware),
        basis="roofline",
        context_fill=fill,
        decode_tok_s_full_context=full,
        detail=_roofline_detail(hardware),
    )


def roofline_decode_tok_s(
    memory: MemoryModel, settings: Settings, hardware: Hardware, fill_tokens: int
) -> float:
    read = _bytes_read_per_token(memory, settings, hardware, fill_tokens)
    seconds = sum(
        n_bytes / (device.bandwidth_gb_s * 1e9 * BANDWIDTH_EFFICIENCY)
        for n_bytes, device in zip(read, hardware.devices, strict=True)
    )
    return 1.0 / seconds if seconds > 0 else 0.0


def roofline_prefill_tok_s(memory: MemoryModel, settings: Settings, hardware: Hardware) -> float:
    read = _bytes_read_per_token(memory, settings, hardware, 0)
    total_read = sum(read) or 1
    params = memory.model.n_params * sum(read) / max(memory.weights.total_bytes, 1)
    seconds = 0.0
    for n_bytes, device in zip(read, hardware.devices, strict=True):
        share = n_bytes / total_read
        seconds += 2 * params * share / (_device_flops(device.kind, device.fp16_tflops))
    if hardware.has_gpu and read[0] > 0:
        ubatch = context_shape(settings).n_ubatch
        seconds += read[0] / (PCIE_BANDWIDTH_GB_S * 1e9) / ubatch  # op offload copies
    return 1.0 / seconds if seconds > 0 else 0.0


def _device_flops(kind: str, fp16_tflops: float | None) -> float:
    if kind == "cpu":
        return CPU_EFFECTIVE_TFLOPS * 1e12
    return (fp16_tflops or 80.0) * 1e12 * GPU_FLOPS_EFFICIENCY


def _bytes_read_per_token(
    memory: MemoryModel, settings: Settings, hardware: Hardware, fill_tokens: int
) -> list[float]:
    """Bytes one decode step reads from each device: active weights and one sequence's KV."""
    placement = memory.layer_placement(settings, hardware)
    n_cpu_moe = settings.n_cpu_moe if hardware.has_gpu else 0
    model = memory.model
    expert_share = model.n_expert_used / model.n_expert if model.n_expert else 1.0
    read = [0.0] * len(hardware.devices)
    table = memory.weights
    read[placement[-1]] += table.output_bytes + (table.tied_output_bytes if placement[-1] else 0)
    for index, layer in enumerate(table.layers):
        read[placement[index]] += layer.dense_bytes
        read[0 if index < n_cpu_moe else placement[index]] += layer.expert_bytes * expert_share
    cells = max(context_shape(settings).n_ctx_seq, 1)
    fraction = min(fill_tokens, cells) / cells / settings.n_parallel
    for layer_index, n_bytes in kv_bytes_by_layer(memory.geometry, settings).items():
        read[placement[layer_index]] += n_bytes * fraction
    return read


def _roofline_detail(hardware: Hardware) -> str:
    parts = [f"{d.name} {d.bandwidth_gb_s:.0f} GB/s" for d in hardware.devices]
    return (
        f"roofline: bytes read per token / ({', '.join(parts)}) at "
        f"{BANDWIDTH_EFFICIENCY:.0%} efficiency; not measured yet"
    )


def load_measured_profile(
    model_name: str, settings: Settings, hardware: Hardware, directory: Path | None = None
) -> MeasuredSpeed | None:
    """The measured speed for this model, quant, KV type and hardware, if bench saved one."""
    folder = directory or data_dir() / "profiles"
    if not folder.is_dir():
        return None
    wanted_ids = {_norm(d.hardware_id) for d in hardware.devices[1:] or hardware.devices}
    for path in sorted(folder.glob("*.json")):
        for record in _records(path):
            if _matches(record, model_name, settings, wanted_ids):
                return MeasuredSpeed(
                    _number(record["decode_tok_s"]), _number(record["prefill_tok_s"]), path.name
                )
    return None


def _records(path: Path) -> list[dict[str, object]]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    items = document if isinstance(document, list) else [document]
    return [item for item in items if isinstance(item, dict)]


def _matches(
    record: dict[str, object], model_name: str, settings: Settings, hardware_ids: set[str]
) -> bool:
    try:
        _number(record["decode_tok_s"])
        _number(record["prefill_tok_s"])
    except (KeyError, TypeError, ValueError):
        return False
    return (
        _norm(record.get("model_name")) == _norm(model_name)
        and _norm(record.get("quant")) == _norm(settings.quant)
        and _norm(record.get("type_k")) == _norm(settings.type_k)
        and _norm(record.get("hardware_id")) in hardware_ids
    )


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _norm(value: object) -> str:
    return str(value).strip().lower() if value is not None else ""
