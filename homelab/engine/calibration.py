"""Calibration records: what loading really allocated, next to what the plan predicted.

After every load the engine appends one JSON line to ``<data_dir>/calibration.jsonl``: the
model, the settings in use, the plan's prediction (when there was a plan) and the actual
memory — llama.cpp's own buffer sizes from its log, the process RSS growth and, on a GPU,
this process's VRAM as NVML reports it. The planner reads these records to show predicted vs
actual and to correct its overhead estimate for the next plan on this machine.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from homelab.engine.loader import LoadReport
from homelab.gguf.model import ModelInfo
from homelab.locations import data_dir, ensure_dir

log = logging.getLogger("homelab.engine")

FILE_NAME = "calibration.jsonl"
MAX_RECORDS_READ = 10_000


@dataclass(frozen=True)
class CalibrationRecord:
    created_at: float  # unix time
    model_path: str
    model_name: str
    architecture: str
    file_type: str
    file_bytes: int
    settings: dict[str, Any]
    ladder_rung: str  # which OOM-ladder rung loaded ("as planned" normally)
    predicted: dict[str, Any] | None  # the planner's numbers, as it gave them
    model_buffers_bytes: dict[str, int]  # per llama.cpp buffer (CPU_Mapped, CUDA0, …)
    kv_buffers_bytes: dict[str, int]
    recurrent_buffers_bytes: dict[str, int]
    compute_buffers_bytes: dict[str, int]
    output_buffers_bytes: dict[str, int]
    rss_delta_bytes: int  # process RSS after loading minus before
    vram_bytes: dict[str, int] | None  # NVML per-process VRAM per GPU index; None on CPU
    llama_total_bytes: int  # sum of every buffer llama.cpp reported

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def calibration_path() -> Path:
    return data_dir() / FILE_NAME


def build_record(
    report: LoadReport, info: ModelInfo, predicted: Mapping[str, Any] | None
) -> CalibrationRecord:
    buffers = report.buffers
    return CalibrationRecord(
        created_at=time.time(),
        model_path=report.model_path,
        model_name=info.name,
        architecture=info.architecture,
        file_type=info.file_type,
        file_bytes=info.file_bytes,
        settings=report.settings.to_dict(),
        ladder_rung=report.succeeded_rung,
        predicted=_jsonable(dict(predicted)) if predicted is not None else None,
        model_buffers_bytes=dict(buffers.model),
        kv_buffers_bytes=dict(buffers.kv),
        recurrent_buffers_bytes=dict(buffers.recurrent),
        compute_buffers_bytes=dict(buffers.compute),
        output_buffers_bytes=dict(buffers.output),
        rss_delta_bytes=report.rss_after_bytes - report.rss_before_bytes,
        vram_bytes=_process_vram(report),
        llama_total_bytes=buffers.total_bytes(),
    )


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _process_vram(report: LoadReport) -> dict[str, int] | None:
    """This process's VRAM per GPU (NVML), only when layers were offloaded."""
    if report.settings.n_gpu_layers == 0:
        return None
    try:
        from homelab.hardware.gpu import gpu_snapshot, our_process_vram_bytes

        snapshots = gpu_snapshot()
    except Exception:  # NVML missing or broken: the record simply has no VRAM figure
        log.debug("no NVML reading for the calibration record", exc_info=True)
        return None
    found = {str(s.index): our_process_vram_bytes(s) for s in snapshots}
    vram = {index: used for index, used in found.items() if used is not None}
    return vram or None


def record_load(
    report: LoadReport, info: ModelInfo, predicted: Mapping[str, Any] | None = None
) -> Path | None:
    """Append the calibration record for this load; never fails the load itself."""
    try:
        record = build_record(report, info, predicted)
        path = calibration_path()
        ensure_dir(path.parent)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record.to_dict(), sort_keys=True) + "\n")
        return path
    except OSError as exc:
        log.warning("could not write the calibration record: %s", exc)
        return None


def read_records(model_name: str | None = None) -> list[CalibrationRecord]:
    """Records from the calibration file (newest last), optionally for one model name."""
    path = calibration_path()
    if not path.exists():
        return []
    records: list[CalibrationRecord] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            record = _parse(line)
            if record is not None and (model_name is None or record.model_name == model_name):
                records.append(record)
    return records[-MAX_RECORDS_READ:]


def _parse(line: str) -> CalibrationRecord | None:
    try:
        return CalibrationRecord(**json.loads(line))
    except (ValueError, TypeError):
        return None  # a line from another version, or a torn write
