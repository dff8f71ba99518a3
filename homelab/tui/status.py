"""What the dashboard would show, as one JSON document (``homelab tui --json``)."""

from __future__ import annotations

from typing import Any

from homelab.errors import HomelabError
from homelab.tui import services
from homelab.tui.hardware_source import HardwareSource, LocalHardware
from homelab.tui.knobs import Knobs


def status_document(model: str | None, hardware: HardwareSource | None = None) -> dict[str, Any]:
    report = (hardware or LocalHardware()).detect()
    choice = services.choose_model(model)
    document: dict[str, Any] = {
        "model": {
            "ref": choice.ref,
            "label": choice.label,
            "kind": choice.kind,
            "demo": choice.is_demo,
            "note": choice.note or None,
            "path": str(choice.path) if choice.path else None,
        },
        "hardware": report.to_dict(),
    }
    try:
        document["plan"] = services.plan_choice(choice, report, Knobs(), verify=True).to_dict()
    except HomelabError as error:
        document["plan"] = None
        document["plan_error"] = {"type": type(error).__name__, "message": str(error)}
    return document
