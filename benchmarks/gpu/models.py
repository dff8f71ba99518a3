"""The models the GPU check runs: the bench demo model and a larger llama-shaped one.

The larger model goes through the demo generator's own code paths (hyperparameters, tokenizer,
seeded random tensors) with an :class:`ArchSpec` of our own; ``homelab.gguf.demo`` only
offers its fixed tiny/bench sizes, so the three pieces are called directly here.
"""

from __future__ import annotations

import os
from pathlib import Path

from homelab.gguf.demo import demo_model_path
from homelab.gguf.generator import ArchSpec, write_spec_model

# ~1.6 B parameters: 3.2 GB in F16, 1.7 GB in Q8_0; head size 128 (CUDA flash attention and
# quantized caches both work); 4 KV heads so a long context costs 48 KiB per token in f16
BIG = ArchSpec(
    "llama", n_vocab=32000, n_embd=2048, n_layer=24, n_head=16, n_head_kv=4, n_ff=8192,
    context_length=32768,
)  # fmt: skip
# the same shape at toy size, for --cpu-smoke on a machine without a GPU
SMOKE_BIG = ArchSpec(
    "llama", n_vocab=1024, n_embd=256, n_layer=6, n_head=4, n_head_kv=2, n_ff=768,
    context_length=4096,
)  # fmt: skip
BIG_STEM = "homelab-gpu-big"


def big_paths(folder: Path) -> tuple[Path, Path]:
    """(F16, Q8_0) paths of the larger model in ``folder``."""
    return folder / f"{BIG_STEM}-F16.gguf", folder / f"{BIG_STEM}-Q8_0.gguf"


def write_f16(path: Path, spec: ArchSpec, seed: int = 1) -> Path:
    """Write an F16 model of ``spec`` at ``path`` (atomically), as the demo generator would."""
    return write_spec_model(path, spec, f"{BIG_STEM}-{spec.n_embd}x{spec.n_layer}", seed)


def generate_f16(folder: Path, bench_size: str, big: ArchSpec) -> dict[str, str]:
    """The F16 files (numpy and gguf only: runs while llama.cpp is still compiling)."""
    bench = demo_model_path("llama", bench_size, "F16", directory=folder)
    big_f16, _ = big_paths(folder)
    if not big_f16.exists():
        write_f16(big_f16, big)
    return {"bench_f16": str(bench), "big_f16": str(big_f16)}


def quantize_all(folder: Path, bench_size: str, big: ArchSpec) -> dict[str, str]:
    """Q8_0 files of both models with llama.cpp's quantizer (generating the F16s if missing)."""
    from homelab.gguf.quantize import quantize_file

    generate_f16(folder, bench_size, big)
    bench = demo_model_path("llama", bench_size, "Q8_0", directory=folder)
    big_f16, big_q8 = big_paths(folder)
    if not big_q8.exists():
        quantize_file(big_f16, big_q8, "Q8_0", n_threads=os.cpu_count())
    return {"bench": str(bench), "big": str(big_q8)}
