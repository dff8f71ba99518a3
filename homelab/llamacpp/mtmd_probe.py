"""What a vision projector costs once loaded: mtmd's own log of one load, without a text model.

``mtmd_get_memory_usage`` is C++ only, so the planner's dry run loads the projector alone
(``mtmd_init_from_file`` takes a null text model: nothing is checked against one) with the
warm-up on, and reads what ``clip.cpp`` logs:

* ``clip_model_loader: model size: X MiB`` — its weights,
* ``<device> compute buffer size = X MiB`` — the compute buffer the warm-up reserved,
  per backend,
* ``warmup with image size = W x H`` — the image size it reserved for.

It allocates for real (weights and buffer), so the planner runs it in a subprocess, once per
projector file and device, and records the result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from homelab.errors import ModelFileError
from homelab.llamacpp._lib import to_bytes
from homelab.llamacpp.log import capture_log, joined, problem_lines
from homelab.llamacpp.mtmd import ProjectorParams, mtmd_bindings, projector_c_params

_MODEL_SIZE = re.compile(r"model size:\s*([\d.]+) MiB")
_COMPUTE = re.compile(r"(\S+) compute buffer size =\s*([\d.]+) MiB")
_WARMUP = re.compile(r"warmup with image size = (\d+) x (\d+)")
MIB = 1024 * 1024


@dataclass(frozen=True)
class ProjectorProbe:
    """One projector load as mtmd logged it (sizes in bytes, from MiB with two decimals)."""

    ok: bool
    error: str = ""
    weights_bytes: int = 0
    compute_bytes: dict[str, int] = field(default_factory=dict)  # backend name -> bytes
    warmup_side_px: int = 0

    @property
    def total_compute_bytes(self) -> int:
        return sum(self.compute_bytes.values())


def parse_probe_log(text: str) -> ProjectorProbe:
    weights = _MODEL_SIZE.search(text)
    warmup = _WARMUP.search(text)
    compute: dict[str, int] = {}
    for name, mib in _COMPUTE.findall(text):
        compute[name] = compute.get(name, 0) + round(float(mib) * MIB)
    return ProjectorProbe(
        ok=True,
        weights_bytes=round(float(weights[1]) * MIB) if weights else 0,
        compute_bytes=compute,
        warmup_side_px=int(warmup[1]) if warmup else 0,
    )


def probe_projector(path: str | Path, params: ProjectorParams) -> ProjectorProbe:
    """Load ``path`` alone with ``params`` (warm-up included), free it, and say what it took."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ModelFileError(file, "vision projector not found", hint="Check --mmproj.")
    mtmd = mtmd_bindings()
    with capture_log() as lines:
        pointer = mtmd.mtmd_init_from_file(to_bytes(file), None, projector_c_params(mtmd, params))
    text = joined(lines)
    if not pointer:
        return ProjectorProbe(ok=False, error=problem_lines(text) or "mtmd refused the file")
    mtmd.mtmd_free(pointer)
    return parse_probe_log(text)
