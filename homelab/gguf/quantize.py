"""Quantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``).

:func:`quantize_file` writes the output atomically and never touches the source.
:func:`quantize_with_provenance` adds what a user-facing run needs: the exact output size
from llama.cpp's dry run, a free-disk check before writing, per-tensor progress, and a
sidecar ``<target>.homelab.json`` recording where the file came from, so ``homelab quality``
can compare the two files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from homelab.errors import ModelFileError
from homelab.gguf.reader import split_parts
from homelab.llamacpp import quantize as llama_quantize
from homelab.llamacpp.quantize import FILE_TYPES
from homelab.units import format_gib

FTYPES = FILE_TYPES  # the quant labels llama.cpp's quantizer writes (label -> llama_ftype)
ALIASES = {"Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q3_K": "Q3_K_M"}
PROVENANCE_SUFFIX = ".homelab.json"
DISK_MARGIN_BYTES = 64 << 20  # the dry run's size is rounded; keep some room besides

Progress = Callable[[int, int], None]  # (tensors done, tensors total)


@dataclass(frozen=True)
class Provenance:
    """Where a locally quantized file came from (the sidecar JSON's content)."""

    source: str  # absolute path of the file that was quantized
    source_bytes: int
    source_file_type: str  # e.g. "F16", "BF16", "Q8_0"
    quant: str  # the type requested, e.g. "Q4_K_M"
    target: str
    target_bytes: int
    requantized: bool  # the source was already quantized (lower quality than from F16/BF16)
    created: str  # ISO 8601, UTC
    tool: str  # e.g. "llama-cpp-python 0.3.36 llama_model_quantize"


def canonical_quant(quant: str, source: Path | None = None) -> str:
    """The FTYPES key for ``quant`` (case and aliases forgiven), or ModelFileError."""
    label = ALIASES.get(quant.strip().upper(), quant.strip().upper())
    if label not in FTYPES:
        raise ModelFileError(
            source or "quantize",
            f"cannot quantize to {quant!r}",
            hint=f"Choose one of {', '.join(sorted(FTYPES))}.",
        )
    return label


def quantized_size_bytes(source: Path, quant: str) -> int:
    """The output size llama.cpp will write, from its dry run (milliseconds, writes nothing)."""
    return llama_quantize.quantized_size_bytes(source, canonical_quant(quant, source))


def require_free_disk(folder: Path, needed_bytes: int, what: str) -> None:
    free_bytes = shutil.disk_usage(folder).free
    if free_bytes < needed_bytes:
        raise ModelFileError(
            folder,
            f"not enough free disk for {what}: needs "
            f"{format_gib(needed_bytes)}, {format_gib(free_bytes)} free",
            hint="Free some space or choose another output folder (--output).",
        )


def quantize_file(
    source: Path,
    target: Path,
    quant: str,
    n_threads: int | None = None,
    *,
    progress: Progress | None = None,
) -> Path:
    """Write ``source`` quantized to ``quant`` at ``target`` (atomic; never touches source)."""
    quant = canonical_quant(quant, source)
    if target.resolve() == source.resolve():
        raise ModelFileError(
            target, "the output would overwrite the source file", hint="Choose another output path."
        )
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".partial", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    try:
        llama_quantize.quantize_gguf(
            source, tmp_path, quant, n_threads=n_threads, progress=progress
        )
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)
    return target


def provenance_path(target: Path) -> Path:
    return target.with_name(target.name + PROVENANCE_SUFFIX)


def read_provenance(target: Path) -> Provenance | None:
    """The sidecar record of a locally quantized file, or None (absent or unreadable)."""
    try:
        data = json.loads(provenance_path(target).read_text())
        return Provenance(**data)
    except (OSError, ValueError, TypeError):
        return None


def _tool_label() -> str:
    try:
        from importlib.metadata import version

        return f"llama-cpp-python {version('llama-cpp-python')} llama_model_quantize"
    except Exception:  # metadata missing in odd installs: the record is still useful
        return "llama-cpp-python llama_model_quantize"


def quantize_with_provenance(
    source: Path,
    target: Path,
    quant: str,
    *,
    source_file_type: str,
    n_threads: int | None = None,
    progress: Progress | None = None,
) -> Provenance:
    """Check disk, quantize, and write ``<target>.homelab.json``; returns the record."""
    quant = canonical_quant(quant, source)
    if target.exists():
        raise ModelFileError(
            target,
            "already exists; homelab does not overwrite model files",
            hint="Delete it first or choose another --output.",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    needed = quantized_size_bytes(source, quant) + DISK_MARGIN_BYTES
    require_free_disk(target.parent, needed, f"the {quant} file")
    quantize_file(source, target, quant, n_threads, progress=progress)
    record = Provenance(
        source=str(source.resolve()),
        source_bytes=sum(p.stat().st_size for p in split_parts(source)),
        source_file_type=source_file_type,
        quant=quant,
        target=str(target.resolve()),
        target_bytes=target.stat().st_size,
        requantized=source_file_type.upper() not in ("F32", "F16", "BF16"),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        tool=_tool_label(),
    )
    provenance_path(target).write_text(json.dumps(asdict(record), indent=2) + "\n")
    return record
