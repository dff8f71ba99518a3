"""``homelab quantize MODEL --to Q4_K_M``: make a smaller file from a higher-precision one.

The output goes next to the source when the source lives in a library folder, and into the
default library folder when it lives in the Hugging Face cache (whose folders belong to the
hub client). The source is never overwritten, free disk is checked first, and the
provenance sidecar lets ``homelab quality`` compare the two files.
"""

from __future__ import annotations

import re
from pathlib import Path

from homelab.errors import ModelFileError
from homelab.gguf.model import ModelInfo
from homelab.gguf.quantize import (
    Progress,
    Provenance,
    canonical_quant,
    quantize_with_provenance,
)
from homelab.gguf.reader import split_parts
from homelab.hub.library import LocalModel, default_library_dir, require_local
from homelab.hub.quants import UNKNOWN_QUANT, quant_label

DEFAULT_QUANT = "Q4_K_M"
# Approximate bits per weight, to refuse "quantizing" into something no smaller.
BITS_PER_WEIGHT = {
    "F32": 32.0,
    "F16": 16.0,
    "BF16": 16.0,
    "Q8_0": 8.5,
    "Q6_K": 6.6,
    "Q5_K_M": 5.7,
    "Q5_K_S": 5.5,
    "Q5_0": 5.5,
    "Q4_K_M": 4.9,
    "Q4_K_S": 4.6,
    "Q4_0": 4.5,
    "IQ4_XS": 4.3,
    "IQ4_NL": 4.5,
    "Q3_K_L": 4.3,
    "Q3_K_M": 3.9,
    "Q3_K_S": 3.5,
    "Q2_K": 3.0,
}
SOURCE_TYPES = ("F32", "F16", "BF16", "Q8_0")  # worth quantizing from


def quantize_suggestion(model: ModelInfo, quant: str = DEFAULT_QUANT) -> str | None:
    """The command that makes a smaller file of ``model``, when it is a high-precision file."""
    if model.file_type.upper() not in SOURCE_TYPES or model.source.startswith("hf://"):
        return None
    return f"homelab quantize {model.source} --to {quant}"


def default_target(source: LocalModel, quant: str) -> Path:
    stem = source.file_stem
    current = quant_label(stem)
    if current != UNKNOWN_QUANT:
        stem = re.sub(
            rf"{re.escape(current)}(?!.*{re.escape(current)})", quant, stem, flags=re.IGNORECASE
        )
    else:
        stem = f"{stem}-{quant}"
    folder = default_library_dir() if source.repo_id else source.path.parent
    return folder / f"{stem}.gguf"


def quantize_model(
    model: str,
    quant: str = DEFAULT_QUANT,
    *,
    output: Path | None = None,
    n_threads: int | None = None,
    progress: Progress | None = None,
) -> Provenance:
    """Quantize the local model ``model`` (path, REPO:QUANT in the cache, or name)."""
    source = require_local(model)
    quant = canonical_quant(quant, source.path)
    _check_worthwhile(source, quant)
    target = (output or default_target(source, quant)).expanduser()
    if target.resolve() in {p.resolve() for p in split_parts(source.path)}:
        raise ModelFileError(
            target, "the output would overwrite the source", hint="Choose another --output."
        )
    return quantize_with_provenance(
        source.path,
        target,
        quant,
        source_file_type=source.quant,
        n_threads=n_threads,
        progress=progress,
    )


def _check_worthwhile(source: LocalModel, quant: str) -> None:
    have = BITS_PER_WEIGHT.get(source.quant.upper())
    want = BITS_PER_WEIGHT.get(quant)
    if have is not None and want is not None and want >= have:
        raise ModelFileError(
            source.path,
            f"is already {source.quant}; {quant} would not be smaller",
            hint="Quantize from a higher-precision file (F16, BF16, Q8_0), or "
            "pull the quant you want with `homelab pull REPO:QUANT`.",
        )
