"""The vision projector in a plan: its memory, the device it goes on, its image-token budget.

A projector (mmproj) costs its **weights** (the sum of its GGUF tensors, as for a text model)
plus the **compute buffer** mtmd reserves with a warm-up encode when it loads. The buffer is
measured once per projector file and device by loading it alone in a subprocess
(:mod:`homelab.llamacpp.mtmd_probe`: ``clip.cpp``'s ``compute buffer size`` log line) and
recorded in ``cache_dir()/projector-compute.json``; without a measurement (``verify=False``,
a catalogue model) a formula estimates it. The warm-up of the Qwen-VL mergers reserves for
46×46 tokens whatever the limit, so for a larger per-image budget the measured buffer is
scaled up to it (what an image of that size makes the scheduler grow to).

Both go on one device: the first local GPU when ``mmproj_offload`` (the default), else the
host. ``image_max_tokens`` is the most tokens one image may take in a slot: the projector's
own maximum (Gemma 3: a fixed count), or ``--image-max-tokens``, lowered to half a slot's
context when the maximum would not leave room for text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from homelab.gguf.projector import QWEN_MERGERS, ProjectorInfo
from homelab.settings import Settings

F32 = 4
PROBE_TIMEOUT_S = 120.0
RECORD_FILE = "projector-compute.json"
WARMUP_TOKENS = dict.fromkeys(QWEN_MERGERS, 46 * 46)  # clip.cpp: set_warmup_n_tokens(46*46)


@dataclass(frozen=True)
class ProjectorCost:
    """A projector as one plan places it."""

    path: str
    projector_type: str
    on_gpu: bool
    weights_bytes: int
    compute_bytes: int
    compute_source: str  # "measured", "measured, scaled to N tokens" or "estimated"
    image_max_tokens: int | None  # the most tokens one image may take (None: not known)
    fixed_tokens: bool  # every image takes exactly image_max_tokens (Gemma 3)
    custom_max_tokens: int = 0  # what mtmd is told (0: the projector's own maximum)
    warmup_bytes: int = 0  # the measured warm-up buffer (0: not measured, estimated)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.compute_bytes

    @property
    def device_kind(self) -> str:
        return "gpu" if self.on_gpu else "cpu"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "projector_type": self.projector_type,
            "device": self.device_kind,
            "weights_bytes": self.weights_bytes,
            "compute_bytes": self.compute_bytes,
            "total_bytes": self.total_bytes,
            "compute_source": self.compute_source,
            "image_max_tokens": self.image_max_tokens,
            "fixed_image_tokens": self.fixed_tokens,
        }


def projector_cost(
    info: ProjectorInfo,
    *,
    on_gpu: bool,
    image_max_tokens: int = 0,
    n_ctx_per_slot: int = 0,
    measure: bool = True,
) -> ProjectorCost:
    """What ``info`` costs on the GPU (``on_gpu``) or the host, with images up to
    ``image_max_tokens`` (0: its own maximum, lowered to half of ``n_ctx_per_slot``)."""
    budget = image_budget(info, image_max_tokens, n_ctx_per_slot)
    measured = measured_compute_bytes(info, on_gpu) if measure else None
    return _costed(info, on_gpu, budget, measured)


def with_budget(cost: ProjectorCost, info: ProjectorInfo, budget: int | None) -> ProjectorCost:
    """``cost`` for images up to ``budget`` tokens (the same measurement, scaled again)."""
    return _costed(info, cost.on_gpu, budget, cost.warmup_bytes or None)


def _costed(
    info: ProjectorInfo, on_gpu: bool, budget: int | None, measured: int | None
) -> ProjectorCost:
    if measured is None:
        compute, source = estimate_compute_bytes(info, budget), "estimated"
    else:
        compute, source = scaled_to(info, measured, budget)
    fixed = info.fixed_image_tokens is not None
    custom = 0 if fixed or budget is None or budget == info.max_image_tokens() else budget
    return ProjectorCost(
        info.path, info.projector_type, on_gpu, info.weights_bytes, compute, source,
        budget, fixed, custom, measured or 0,
    )  # fmt: skip


def image_budget(info: ProjectorInfo, requested: int, n_ctx_per_slot: int) -> int | None:
    """Tokens one image may take: ``requested`` or the projector's maximum, lowered to half a
    slot (a fixed count cannot be lowered)."""
    if info.fixed_image_tokens is not None:
        return info.fixed_image_tokens
    most = info.max_image_tokens(requested)
    if most is not None and n_ctx_per_slot and not requested:
        return min(most, max(n_ctx_per_slot // 2, 1))
    return most


def scaled_to(info: ProjectorInfo, measured_bytes: int, budget: int | None) -> tuple[int, str]:
    """The measured warm-up buffer, grown in proportion when images may be larger than the
    warm-up reserved for."""
    warmup = WARMUP_TOKENS.get(info.projector_type)
    if warmup is None or budget is None or budget <= warmup:
        return measured_bytes, "measured"
    return -(-measured_bytes * budget // warmup), f"measured, scaled to {budget} tokens"


def estimate_compute_bytes(info: ProjectorInfo, budget: int | None) -> int:
    """A rough buffer for one image through the tower: activations of each patch (f32) plus
    one head's attention scores when flash attention is off (the CPU has it; assumed here)."""
    tokens = budget or WARMUP_TOKENS.get(info.projector_type, 256)
    patches = tokens * max(1, info.n_merge) ** 2
    width = max(info.n_embd_vision, 1)
    return F32 * patches * (6 * width + 2 * max(info.n_ff_vision, width))


def projector_settings(settings: Settings, cost: ProjectorCost | None) -> Settings:
    """``settings`` with the fields that load the projector ``cost`` places."""
    if cost is None:
        return settings
    return replace(
        settings,
        mmproj_path=cost.path,
        mmproj_offload=cost.on_gpu,
        image_max_tokens=cost.custom_max_tokens,
    )


# --- measuring once and recording ------------------------------------------------------------


def _record_path() -> Path:
    from homelab.locations import cache_dir

    return cache_dir() / RECORD_FILE


def _key(info: ProjectorInfo, on_gpu: bool) -> str:
    path = Path(info.path)
    stat = path.stat()
    device = "gpu" if on_gpu else "cpu"
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{device}"


def _records() -> dict[str, int]:
    try:
        document = json.loads(_record_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: int(v) for k, v in document.items()} if isinstance(document, dict) else {}


def measured_compute_bytes(info: ProjectorInfo, on_gpu: bool) -> int | None:
    """The warm-up buffer mtmd reserves for ``info`` (recorded, or measured now in a
    subprocess and recorded); None when it cannot be measured here."""
    try:
        key = _key(info, on_gpu)
    except OSError:
        return None
    records = _records()
    if key in records:
        return records[key]
    measured = _probe_in_subprocess(info.path, on_gpu)
    if measured is None:
        return None
    records[key] = measured
    path = _record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(records, indent=1), encoding="utf-8")
    temporary.replace(path)
    return measured


def _probe_in_subprocess(path: str, on_gpu: bool) -> int | None:
    request = json.dumps({"path": path, "use_gpu": on_gpu})
    try:
        finished = subprocess.run(
            [sys.executable, "-m", "homelab.planner.projector"],
            input=request,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
        document = json.loads(finished.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, ValueError):
        return None
    compute = document.get("compute_bytes")
    return int(compute) if document.get("ok") and isinstance(compute, int) else None


def main() -> int:
    """In the subprocess: load the projector alone once, print what it reserved (JSON)."""
    from homelab.llamacpp.mtmd import ProjectorParams
    from homelab.llamacpp.mtmd_probe import probe_projector

    request = json.loads(sys.stdin.read())
    try:
        probe = probe_projector(request["path"], ProjectorParams(use_gpu=request["use_gpu"]))
        result = {"ok": probe.ok, "error": probe.error, "compute_bytes": probe.total_compute_bytes}
    except Exception as error:  # report, don't crash: the parent falls back to the formula
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
