"""The CUDA runtime overhead measured on this machine, from the engine's calibration records.

After each load the engine appends a JSON line to ``data_dir()/calibration.jsonl`` with
llama.cpp's buffer sizes per backend (``model_buffers_bytes``, ``kv_buffers_bytes``,
``recurrent_buffers_bytes``, ``compute_buffers_bytes``, keyed like ``"CUDA0"``) and this
process's VRAM per GPU index from NVML (``vram_bytes``, keyed ``"0"``). What NVML counts
beyond llama.cpp's buffers is the overhead (CUDA context, cuBLAS workspace, pool); the planner
uses the largest of the recent measurements instead of the profile's default. The file is read
directly so the planner does not depend on the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

from homelab.locations import data_dir

CALIBRATION_FILE = "calibration.jsonl"
RECENT_RECORDS = 20
BUFFER_KEYS = (
    "model_buffers_bytes",
    "kv_buffers_bytes",
    "recurrent_buffers_bytes",
    "compute_buffers_bytes",
)


def measured_gpu_overhead(gpu_index: int, path: Path | None = None) -> int | None:
    """The largest overhead recently measured on GPU ``gpu_index``, or None without records."""
    path = path or data_dir() / CALIBRATION_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()[-RECENT_RECORDS:]
    except OSError:
        return None
    overheads = [_overhead(line, gpu_index) for line in lines]
    found = [value for value in overheads if value is not None]
    return max(found) if found else None


def _overhead(line: str, gpu_index: int) -> int | None:
    try:
        record = json.loads(line)
        vram = record.get("vram_bytes") or {}
        used = vram.get(str(gpu_index))
        if not isinstance(used, int):
            return None
        device = f"CUDA{gpu_index}"
        buffers = sum(int(record.get(key, {}).get(device, 0)) for key in BUFFER_KEYS)
    except (ValueError, TypeError, AttributeError):
        return None  # a torn line or another format: not a measurement
    overhead = used - buffers
    return overhead if overhead > 0 else None
