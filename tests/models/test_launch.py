"""The one plan-then-load: the plan's memory prediction reaches the calibration record (from the
CLI's path and the TUI's), overrides apply, and a plan is loaded from the file it was made for."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from homelab.engine.calibration import read_records
from homelab.errors import ModelFileError
from homelab.gguf.reader import read_model
from homelab.models.launch import Overrides, load_plan, open_engine, plan_file
from homelab.models.ref import resolve
from homelab.planner.budget import resolve_hardware
from homelab.planner.plan import plan_model
from homelab.planner.search import PlanRequest

REQUEST = PlanRequest(ctx=256, parallel=1)


def test_open_engine_records_the_memory_prediction_and_applies_overrides(
    own_home: Path, demo_model: Callable[..., Path]
) -> None:
    ref = resolve(str(demo_model("llama", "tiny", "Q8_0")))
    engine, plan = open_engine(ref, REQUEST, resolve_hardware(), Overrides(n_threads=1))
    with engine:
        assert engine.settings == replace(plan.settings, n_threads=1)
    (record,) = read_records()
    assert record.predicted == plan.memory.to_dict()


def test_the_dashboard_load_records_the_memory_prediction_not_the_speed(
    own_home: Path, demo_model: Callable[..., Path]
) -> None:
    from homelab.tui import services
    from homelab.tui.knobs import Knobs

    choice = services.choose_model(str(demo_model("llama", "tiny", "Q8_0")))
    report = _report()
    plan = services.plan_choice(choice, report, Knobs(n_ctx_per_slot=256, n_parallel=1))
    with services.load_engine(choice, plan):
        pass
    (record,) = read_records()
    assert record.predicted is not None
    assert record.predicted == plan.memory.to_dict()
    assert "weights_bytes" in record.predicted and "decode_tok_s" not in record.predicted


def _report():  # type: ignore[no-untyped-def]
    from homelab.hardware.report import detect

    return detect()


def test_a_plan_loads_the_sibling_it_chose(
    own_home: Path, tmp_path: Path, demo_model: Callable[..., Path]
) -> None:
    for quant in ("F16", "Q8_0"):
        shutil.copy(demo_model("llama", "tiny", quant), tmp_path / f"Tiny-{quant}.gguf")
    ref = resolve(str(tmp_path / "Tiny-Q8_0.gguf"))
    plan = plan_model(ref.variants(), resolve_hardware(), REQUEST, verify=False)
    assert plan.settings.quant == "F16"  # the better sibling fits too
    with load_plan(ref, plan) as engine:
        assert engine.load_report.model_path == str(tmp_path / "Tiny-F16.gguf")
    assert plan_file(ref, REQUEST, resolve_hardware(), verify=False).settings.quant == "Q8_0"


def test_a_plan_for_a_quant_that_is_not_here_is_refused(
    own_home: Path, demo_model: Callable[..., Path]
) -> None:
    ref = resolve(str(demo_model("llama", "tiny", "Q8_0")))
    remote = replace(read_model(demo_model("llama", "tiny", "F16")), source="hf://org/x/F16.gguf")
    plan = plan_model(remote, resolve_hardware(), REQUEST, verify=False)
    with pytest.raises(ModelFileError, match="the plan chose F16, which is not downloaded"):
        load_plan(ref, plan)
    assert read_records() == []  # nothing was loaded
