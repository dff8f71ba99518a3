"""Other quantizations of the same model next to a weights file, and which is the most precise.

Files of one model differ only by the quant label in their names
(``Qwen3-8B-Q4_K_M.gguf`` / ``Qwen3-8B-Q8_0.gguf``,
``homelab-demo-llama-bench-v2-F16.gguf`` / ``...-Q4_0.gguf``). Precision is ranked by the
bits each file really spends per weight (file bytes × 8 / parameters), read from the GGUF
headers — not by trusting the label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from homelab.errors import HomelabError
from homelab.gguf.reader import read_model
from homelab.hub.quants import QUANT_RE, UNKNOWN_QUANT, quant_label


@dataclass(frozen=True)
class WeightsFile:
    path: Path
    quant: str  # label from the file name ("?" when it has none)
    bits_per_weight: float


def _name_without_quant(name: str) -> str:
    return QUANT_RE.sub("", name.removesuffix(".gguf")).strip("-_.").lower()


def sibling_files(path: Path) -> list[Path]:
    """``path`` and the files beside it that name the same model with another quant."""
    path = Path(path).expanduser().resolve()
    if quant_label(path.name) == UNKNOWN_QUANT:
        return [path]
    stem = _name_without_quant(path.name)
    found = [
        candidate.resolve()
        for candidate in sorted(path.parent.glob("*.gguf"))
        if _name_without_quant(candidate.name) == stem
        and not re.search(r"-\d{5}-of-\d{5}", candidate.name)  # split sets: not compared
    ]
    return found if path in found else [path, *found]


def describe(path: Path) -> WeightsFile:
    info = read_model(path)
    bits = info.weights_bytes * 8 / info.n_params if info.n_params else 0.0
    label = quant_label(path.name)
    return WeightsFile(path, info.file_type if label == UNKNOWN_QUANT else label, bits)


def most_precise(path: Path) -> WeightsFile:
    """The sibling of ``path`` (possibly itself) with the most bits per weight."""
    candidates = []
    for candidate in sibling_files(path):
        try:
            candidates.append(describe(candidate))
        except HomelabError:
            continue  # an unreadable neighbour is not a reference
    if not candidates:
        return describe(path)
    return max(candidates, key=lambda weights: weights.bits_per_weight)
