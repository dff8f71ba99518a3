"""Where llama.cpp puts each weight tensor (``llama_model::load_tensors``), in bytes per device.

Device index 0 is the CPU, 1.. the GPUs in order. The rules:

* the input layer (token embeddings) always stays on the CPU;
* the output head counts as layer ``n_layer`` and is the first thing offloaded;
* block ``il`` goes to a GPU iff ``il >= n_layer + 1 - n_gpu_layers``; several GPUs share the
  offloaded layers in proportion to ``split`` (free memory, or a tensor split), chosen with
  ``upper_bound`` over the normalised running sum in float32;
* expert tensors (``*_exps``) of the first ``n_cpu_moe`` blocks stay on the CPU
  (``--n-cpu-moe``);
* ``--split-mode none`` (``llama_model_params.split_mode``): llama.cpp keeps only the main
  offload device (``--main-gpu``, an index into the offload devices: RPC devices first, then
  the local GPUs), so every offloaded layer, its KV cache and the compute buffer are there and
  the other devices hold nothing; ``row`` (CUDA only) splits each matrix by rows over the GPUs
  in the same shares as ``layer`` — planned as ``layer``: the same bytes per device up to
  where each matrix's rows fall;
* multi-token-prediction blocks are not loaded;
* a tied output head (no ``output.weight``) is a second copy of ``token_embd`` on the output
  device when that device is a GPU;
* on an AVX2 CPU, Q4_0 / Q4_K / IQ4_NL matrices kept on the CPU are repacked into anonymous
  memory (the ``CPU_REPACK`` buffer); their mapped file pages are read once and stay only as
  reclaimable page cache, so each tensor still costs its size once. The repacked bytes are
  tracked (``*_repack_bytes``) to explain the log's two CPU buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from homelab.errors import PlanError
from homelab.gguf.model import ModelInfo, TensorInfo
from homelab.planner.budget import Hardware
from homelab.planner.geometry import cache_geometry

CPU_REPACK_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL"})
INPUT_TENSOR_PREFIXES = ("token_embd", "position_embd", "token_types")
SPLIT_MODES = ("layer", "row", "none")  # --split-mode, llama.cpp's enum llama_split_mode


def offload_split(split: Sequence[float], split_mode: str, main_gpu: int) -> tuple[float, ...]:
    """The shares llama.cpp divides the offloaded layers by: ``split`` (one per offload
    device), or, with ``none``, everything to the main device."""
    if split_mode != "none" or not split:
        return tuple(split)
    return tuple(1.0 if index == main_gpu else 0.0 for index in range(len(split)))


def unused_devices(n_devices: int, split_mode: str, main_gpu: int) -> frozenset[int]:
    """Device indexes (0 = CPU) llama.cpp leaves out entirely: with ``none``, every offload
    device but the main one (no layers, no KV, no compute buffer, no runtime)."""
    if split_mode != "none":
        return frozenset()
    return frozenset(index for index in range(1, n_devices) if index != main_gpu + 1)


def check_split_mode(split_mode: str, main_gpu: int, hardware: Hardware) -> None:
    """A PlanError for a split llama.cpp cannot do on ``hardware``."""
    if split_mode not in SPLIT_MODES:
        raise PlanError(
            f"--split-mode {split_mode!r} is not a split mode.",
            hint=f"Use one of: {', '.join(SPLIT_MODES)}.",
        )
    names = [device.name for device in hardware.gpus]
    if main_gpu < 0 or (names and main_gpu >= len(names)):
        raise PlanError(
            f"--main-gpu {main_gpu} names no offload device (there are {len(names)}).",
            hint="Count from 0 over: " + (", ".join(names) or "none (no GPU, no worker)") + ".",
        )
    not_cuda = [d.name for d in hardware.gpus if d.endpoint or not d.name.startswith("CUDA")]
    if split_mode == "row" and (not names or not_cuda):
        raise PlanError(
            "--split-mode row needs CUDA GPUs of this machine only: llama.cpp splits rows "
            f"with CUDA's split buffer ({', '.join(not_cuda) or 'no GPU here'} cannot).",
            hint="Use --split-mode layer (the default), or none with --main-gpu N.",
        )


def layer_devices(n_layer: int, n_gpu_layers: int, split: Sequence[float]) -> tuple[int, ...]:
    """Device of each block, then of the output layer (last entry): 0 = CPU, 1.. = GPUs."""
    if not split or n_gpu_layers <= 0:
        return (0,) * (n_layer + 1)
    bounds = np.cumsum(np.asarray(split, dtype=np.float32), dtype=np.float32)
    bounds = (bounds / bounds[-1]).astype(np.float32)
    start = max(n_layer + 1 - n_gpu_layers, 0)
    active = min(n_gpu_layers, n_layer + 1)
    devices = []
    for layer in range(n_layer + 1):
        if layer < start or layer - start >= active:
            devices.append(0)
            continue
        fraction = np.float32(layer - start) / np.float32(active)
        gpu = int(np.searchsorted(bounds, fraction, side="right"))
        devices.append(1 + min(gpu, len(split) - 1))
    return tuple(devices)


def is_repacked_on_cpu(tensor: TensorInfo) -> bool:
    """Whether the AVX2 CPU backend keeps an interleaved copy of this matrix."""
    if tensor.type_name not in CPU_REPACK_TYPES or tensor.layer is None:
        return False
    return len(tensor.shape) < 2 or tensor.shape[1] % 8 == 0


@dataclass(frozen=True)
class LayerWeights:
    """Bytes of one block, split by what can move separately."""

    dense_bytes: int = 0  # everything but the routed experts
    expert_bytes: int = 0
    dense_repack_bytes: int = 0
    expert_repack_bytes: int = 0
    largest_tensor_bytes: int = 0


@dataclass(frozen=True)
class WeightTable:
    """A model's weights summed per block, so placing them is O(layers)."""

    layers: tuple[LayerWeights, ...]  # trunk blocks only (MTP blocks are not loaded)
    input_bytes: int  # token embeddings (and other input tensors), always on the CPU
    output_bytes: int  # output head and final norm
    tied_output_bytes: int  # copy of token_embd made for a tied head on a GPU (0 if untied)

    @property
    def total_bytes(self) -> int:
        blocks = sum(layer.dense_bytes + layer.expert_bytes for layer in self.layers)
        return self.input_bytes + self.output_bytes + blocks

    def by_device(self, devices: tuple[int, ...], n_cpu_moe: int, n_devices: int) -> list[int]:
        """Weight bytes per device index for a layer placement from :func:`layer_devices`."""
        sizes = [0] * n_devices
        sizes[0] += self.input_bytes
        output_device = devices[-1]
        sizes[output_device] += self.output_bytes
        if output_device != 0:
            sizes[output_device] += self.tied_output_bytes
        for index, layer in enumerate(self.layers):
            experts_on_cpu = index < n_cpu_moe
            device = devices[index]
            sizes[device] += layer.dense_bytes
            sizes[0 if experts_on_cpu else device] += layer.expert_bytes
        return sizes

    def largest_cpu_tensor_bytes(self, devices: tuple[int, ...], n_cpu_moe: int) -> int:
        """The biggest block tensor left on the CPU (op offload copies it to the GPU)."""
        sizes = [
            layer.largest_tensor_bytes
            for index, layer in enumerate(self.layers)
            if devices[index] == 0 or index < n_cpu_moe
        ]
        return max(sizes, default=0)


def weight_table(model: ModelInfo) -> WeightTable:
    trunk = cache_geometry(model).n_layer_trunk
    per_layer: list[dict[str, int]] = [
        dict.fromkeys(("dense", "expert", "dense_repack", "expert_repack", "largest"), 0)
        for _ in range(trunk)
    ]
    input_bytes = output_bytes = 0
    for tensor in model.tensors:
        layer = tensor.layer
        if layer is None:
            if tensor.name.startswith(INPUT_TENSOR_PREFIXES):
                input_bytes += tensor.n_bytes
            else:
                output_bytes += tensor.n_bytes
            continue
        if layer >= trunk:
            continue
        _add_tensor(per_layer[layer], tensor)
    return WeightTable(
        layers=tuple(_layer_weights(sums) for sums in per_layer),
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        tied_output_bytes=0 if _has_output_head(model) else _token_embd_bytes(model),
    )


def _add_tensor(sums: dict[str, int], tensor: TensorInfo) -> None:
    kind = "expert" if tensor.is_expert else "dense"
    sums[kind] += tensor.n_bytes
    if is_repacked_on_cpu(tensor):
        sums[f"{kind}_repack"] += tensor.n_bytes
    sums["largest"] = max(sums["largest"], tensor.n_bytes)


def _layer_weights(sums: dict[str, int]) -> LayerWeights:
    return LayerWeights(
        sums["dense"], sums["expert"], sums["dense_repack"], sums["expert_repack"], sums["largest"]
    )


def _has_output_head(model: ModelInfo) -> bool:
    return any(t.name == "output.weight" for t in model.tensors)


def _token_embd_bytes(model: ModelInfo) -> int:
    return sum(t.n_bytes for t in model.tensors if t.name == "token_embd.weight")
