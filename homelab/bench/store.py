"""Where measurements are kept: hardware profiles (speed) and the last quality result per model.

    data_dir()/profiles/<model>-<quant>-<kv>-<hardware>.json   one per configuration measured
    data_dir()/quality/<model>.json                             the last `homelab quality`

A profile carries the flat keys the planner reads (``model_name``, ``quant``, ``type_k``,
``decode_tok_s``, ``prefill_tok_s``, ``hardware_id``; see
``homelab.planner.predict.load_measured_profile``) and, beside them, everything needed to
trust or discard it later: the machine (GPUs, CPU, llama.cpp build), the settings, every
sample, the concurrency table, and the date. Files are written atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from homelab.bench.concurrency import ConcurrencyTable
from homelab.bench.profile import SpeedResult
from homelab.bench.quality import QualityResult
from homelab.hardware.report import HardwareReport
from homelab.locations import data_dir, ensure_dir

PROFILE_FORMAT = 1
log = logging.getLogger("homelab.bench")


def profiles_path() -> Path:
    return data_dir() / "profiles"


def quality_path() -> Path:
    return data_dir() / "quality"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "model"


def write_json(path: Path, document: dict[str, Any]) -> Path:
    """Write ``document`` to ``path`` atomically (a reader never sees half a file)."""
    ensure_dir(path.parent)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, suffix=".partial", delete=False, encoding="utf-8"
    ) as handle:
        json.dump(document, handle, indent=2)
        temporary = Path(handle.name)
    os.replace(temporary, path)
    return path


# --- hardware identity -------------------------------------------------------------------


def hardware_id(report: HardwareReport) -> str:
    """A stable name for this machine's compute: its GPUs, else its CPU."""
    if report.gpus:
        names = sorted(gpu.name for gpu in report.gpus)
        return "gpu:" + "+".join(names)
    cores = report.cpu.usable_cores or report.cpu.logical_cores or 0
    return f"cpu:{report.cpu.model} x{cores}"


def hardware_summary(report: HardwareReport) -> dict[str, Any]:
    return {
        "gpus": [
            {"name": g.name, "uuid": g.uuid, "memory_total_bytes": g.memory_total_bytes}
            for g in report.gpus
        ],
        "cpu": report.cpu.model,
        "cpu_cores": report.cpu.usable_cores,
        "ram_bytes": report.memory.ram_total_bytes,
        "llama_cpp_python": report.build.version,
        "backends": list(report.build.backends),
        "gpu_offload": report.build.gpu_offload,
    }


# --- profiles ----------------------------------------------------------------------------


def profile_document(
    *,
    model_name: str,
    model_path: str,
    speed: SpeedResult,
    table: ConcurrencyTable | None,
    report: HardwareReport,
) -> dict[str, Any]:
    settings = speed.settings
    return {
        "format": PROFILE_FORMAT,
        "model_name": model_name,
        "quant": settings.quant,
        "type_k": settings.type_k,
        "type_v": settings.type_v,
        "decode_tok_s": speed.decode_tok_s.median,
        "prefill_tok_s": speed.prefill_tok_s.median,
        "hardware_id": hardware_id(report),
        "measured_at": now_iso(),
        "model_path": model_path,
        "hardware": hardware_summary(report),
        "settings": settings.to_dict(),
        "speed": speed.to_dict(),
        "concurrency": table.to_dict() if table is not None else None,
    }


def profile_file(document: dict[str, Any]) -> Path:
    machine = hashlib.sha256(str(document["hardware_id"]).encode()).hexdigest()[:10]
    name = "-".join(slug(str(document[key])) for key in ("model_name", "quant", "type_k"))
    return profiles_path() / f"{name}-{machine}.json"


def save_profile(document: dict[str, Any]) -> Path:
    return write_json(profile_file(document), document)


def load_profiles() -> list[dict[str, Any]]:
    """Every readable profile (unreadable files are skipped: a profile is a hint, not a need)."""
    documents = []
    for path in sorted(profiles_path().glob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(document, dict):
            documents.append(document)
    return documents


# --- quality -----------------------------------------------------------------------------


def quality_file(model_name: str) -> Path:
    return quality_path() / f"{slug(model_name)}.json"


def save_quality(result: QualityResult) -> Path:
    return write_json(quality_file(result.model_name), result.to_dict())


def load_last_quality(model_name: str) -> QualityResult | None:
    """The last quality result saved for ``model_name``; None if there is none or it is unreadable
    (the dashboard must not fail over a damaged file: it logs it and shows nothing)."""
    path = quality_file(model_name)
    try:
        return QualityResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        log.warning("ignoring the unreadable quality result %s", path, exc_info=True)
        return None
