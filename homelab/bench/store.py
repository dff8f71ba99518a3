"""Where measurements are kept: hardware profiles (speed) and the last quality result per model.

    data_dir()/profiles/<model>-<quant>-<machine>.json   the last `homelab bench`: a list of
                                                         records, one per K/V type measured
    data_dir()/quality/<model>.json                      the last `homelab quality`

A profile record carries the flat keys the planner reads (``model_name``, ``quant``, ``type_k``,
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


def write_json(path: Path, document: dict[str, Any] | list[dict[str, Any]]) -> Path:
    """Write ``document`` to ``path`` atomically (a reader never sees half a file)."""
    ensure_dir(path.parent)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, suffix=".partial", delete=False, encoding="utf-8"
    ) as handle:
        json.dump(document, handle, indent=2)
        temporary = Path(handle.name)
    os.replace(temporary, path)
    return path


# --- profiles ----------------------------------------------------------------------------


def hardware_summary(report: HardwareReport) -> dict[str, Any]:
    """The machine a profile was measured on, for whoever reads the profile later."""
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


def profile_records(
    *,
    model_name: str,
    model_path: str,
    hardware_id: str,
    hardware: dict[str, Any],
    speed: SpeedResult,
    table: ConcurrencyTable | None,
) -> list[dict[str, Any]]:
    """The planned configuration's pp/tg record first, then one per other K/V type of the
    table, from its single-request row (decode rate; prefill from that row's TTFT)."""
    settings = speed.settings
    base = {"format": PROFILE_FORMAT, "model_name": model_name, "quant": settings.quant}
    base |= {"hardware_id": hardware_id, "measured_at": now_iso(), "model_path": model_path}
    first = base | {
        "type_k": settings.type_k,
        "type_v": settings.type_v,
        "decode_tok_s": speed.decode_tok_s.median,
        "prefill_tok_s": speed.prefill_tok_s.median,
        "source": f"{speed.pp_label}/{speed.tg_label}, median of {speed.repetitions}",
        "hardware": hardware,
        "settings": settings.to_dict(),
        "speed": speed.to_dict(),
        "concurrency": table.to_dict() if table is not None else None,
    }
    return [first, *_table_records(base, table, {settings.type_k})]


def _table_records(
    base: dict[str, Any], table: ConcurrencyTable | None, done: set[str]
) -> list[dict[str, Any]]:
    records = []
    for kv_type in table.kv_types if table is not None else ():
        cell = table.cell(kv_type, 1) if table is not None else None
        if kv_type in done or cell is None or not cell.measured or not cell.ttft_p50_s:
            continue
        assert table is not None and cell.mean_stream_decode_tok_s is not None
        records.append(
            base
            | {
                "type_k": kv_type,
                "type_v": kv_type,
                "decode_tok_s": cell.mean_stream_decode_tok_s,
                "prefill_tok_s": table.prompt_tokens / cell.ttft_p50_s,
                "source": f"concurrency table, 1 request of {table.prompt_tokens} + "
                f"{table.generated_tokens} tokens",
            }
        )
    return records


def profile_file(records: list[dict[str, Any]]) -> Path:
    """One file per model, quant and machine: a new run replaces the last one."""
    first = records[0]
    machine = hashlib.sha256(str(first["hardware_id"]).encode()).hexdigest()[:10]
    return profiles_path() / f"{slug(first['model_name'])}-{slug(first['quant'])}-{machine}.json"


def save_profile(records: list[dict[str, Any]]) -> Path:
    if not records:
        raise ValueError("no profile records to save")
    path = profile_file(records)
    ensure_dir(path.parent)
    return write_json(path, records)


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
