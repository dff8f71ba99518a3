"""llama.cpp's rules for KV cache types and flash attention, checked before planning.

* a quantized V cache requires flash attention (context creation fails otherwise);
* quantized K/V rows must be whole blocks: every cached head size a multiple of 32;
* MLA caches store K only, so ``type_k`` must equal ``type_v``;
* CUDA has no flash-attention kernel for ``iq4_nl`` caches, and runs only f16/f16, bf16/bf16,
  q8_0/q8_0 and q4_0/q4_0 on its fast kernels (other pairs fall back to a slow path);
* where flash attention is unsupported (CUDA kernels exist only for some head sizes), V cannot
  be quantized.
"""

from __future__ import annotations

from homelab.errors import PlanError
from homelab.gguf.model import ModelInfo
from homelab.planner.budget import Hardware
from homelab.planner.cache import CACHE_TYPE_BLOCKS, is_quantized
from homelab.planner.geometry import cache_geometry
from homelab.settings import COMPARED_KV_TYPES, KV_TYPES

KvPair = tuple[str, str]
DEFAULT_KV_PAIRS: tuple[KvPair, ...] = tuple((t, t) for t in COMPARED_KV_TYPES)
FAST_CUDA_PAIRS = frozenset({("f16", "f16"), ("bf16", "bf16"), ("q8_0", "q8_0"), ("q4_0", "q4_0")})
# best first: bits per value of the cache types
KV_QUALITY = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q5_1": 6.0, "q5_0": 5.5,
              "q4_1": 5.0, "q4_0": 4.5, "iq4_nl": 4.5}  # fmt: skip
# head sizes (K, V) with CUDA flash-attention kernels (ggml-cuda/fattn.cu)
CUDA_FA_HEAD_SIZES = frozenset({40, 64, 72, 80, 96, 112, 128, 256})
CUDA_FA_MLA_SIZES = frozenset({(576, 512), (512, 512)})
CUDA_FA_CACHE_TYPES = frozenset({"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"})


def parse_kv(text: str) -> KvPair:
    """``"q8_0"`` -> (q8_0, q8_0); ``"q8_0/f16"`` -> (q8_0, f16)."""
    parts = [part.strip().lower() for part in text.split("/")]
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or any(part not in KV_TYPES for part in parts):
        raise PlanError(
            f"--kv {text!r} is not a KV cache type or K/V pair.",
            hint=f"Use one of {', '.join(KV_TYPES)}, or K/V such as q8_0/q8_0.",
        )
    return parts[0], parts[1]


def kv_label(pair: KvPair) -> str:
    return f"{pair[0]}/{pair[1]}"


def kv_quality(pair: KvPair) -> float:
    return KV_QUALITY[pair[0]] + KV_QUALITY[pair[1]]


def flash_attn_problem(model: ModelInfo, hardware: Hardware) -> str | None:
    """Why flash attention cannot run for ``model`` on ``hardware`` (None: it can)."""
    if not hardware.has_gpu:
        return None
    geometry = cache_geometry(model)
    if not geometry.kv_layers:
        return None
    k = model.head_dim_k
    if geometry.mla:
        v = k - model.n_rot  # the latent part of K serves as V
        ok = (k, v) in CUDA_FA_MLA_SIZES
    else:
        v = model.head_dim_v
        ok = (k == v and k in CUDA_FA_HEAD_SIZES) or _wide_gqa_ok(model, k, v)
    if ok:
        return None
    return f"CUDA has no flash-attention kernel for head size {k}/{v}"


def all_layers_on_cpu(hardware: Hardware, n_gpu_layers: int | None) -> bool:
    """Whether every layer runs on the CPU: no GPU, or ``--n-gpu-layers 0``."""
    return not hardware.has_gpu or n_gpu_layers == 0


def wants_flash_attn(
    model: ModelInfo, hardware: Hardware, pair: KvPair, n_gpu_layers: int | None
) -> bool:
    """Flash attention, when the user leaves it open. With layers on a GPU: on wherever CUDA
    has the kernel (smaller compute buffers, and a quantized V needs it). With every layer
    on the CPU: only for a quantized V, which needs it — llama.cpp's CPU kernel decodes
    slowly once the cache fills: measured with llama-bench (2 threads, this project's demo
    models), tokens/s at a depth of 1,024 cells were 0.4-0.6x of the same without it (124M
    Q8_0: 62 vs 103; at 4,096: 26 vs 65), while prompts were read 1.1-1.3x faster with it
    (benchmarks/RESULTS.md)."""
    if all_layers_on_cpu(hardware, n_gpu_layers):
        return is_quantized(pair[1])
    return flash_attn_problem(model, hardware) is None


def _wide_gqa_ok(model: ModelInfo, k: int, v: int) -> bool:
    """DeepSeek-style 192/128 and 320/256 heads run only with large GQA ratios."""
    n_head_kv = max(model.n_head_kv) or 1
    ratio = model.n_head[0] // n_head_kv
    return ((k, v) == (192, 128) and ratio % 8 == 0) or ((k, v) == (320, 256) and ratio % 32 == 0)


def kv_pair_problem(
    model: ModelInfo, hardware: Hardware, pair: KvPair, flash_attn: bool
) -> str | None:
    """Why llama.cpp would refuse (or badly run) this K/V type pair, else None."""
    type_k, type_v = pair
    geometry = cache_geometry(model)
    if geometry.mla and type_k != type_v:
        return "MLA models store K only, so the K and V types must be equal"
    if is_quantized(type_v) and not flash_attn:
        return "a quantized V cache needs flash attention, which is off"
    for cache_type in {type_k, type_v}:
        block = CACHE_TYPE_BLOCKS[cache_type][0]
        bad = [d for d in geometry.head_dims if d % block]
        if bad:
            return (
                f"{cache_type} needs head sizes that are multiples of {block} "
                f"(this model: {bad[0]})"
            )
    if hardware.has_gpu and "iq4_nl" in pair:
        return "CUDA has no flash-attention kernel for iq4_nl caches"
    if hardware.has_gpu and flash_attn and not set(pair) <= CUDA_FA_CACHE_TYPES:
        return f"CUDA flash attention does not support {kv_label(pair)}"
    return None


def slow_pair_note(hardware: Hardware, pair: KvPair) -> str | None:
    if hardware.has_gpu and pair not in FAST_CUDA_PAIRS:
        return (
            f"{kv_label(pair)} has no fast CUDA flash-attention kernel; prompt processing can "
            "be several times slower than with f16/f16, q8_0/q8_0 or q4_0/q4_0"
        )
    return None
