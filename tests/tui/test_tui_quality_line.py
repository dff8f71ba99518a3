"""The plan panel shows the last measured quality cost next to the plan (issue 7 → TUI)."""

from __future__ import annotations

from homelab.bench.quality import QualityConfig, measure_quality, read_text
from homelab.bench.store import quality_file, save_quality
from homelab.gguf.demo import demo_ref_path
from homelab.gguf.reader import read_model
from homelab.planner.budget import resolve_hardware
from homelab.planner.plan import plan_model
from homelab.tui.plan_view import plan_view


def test_plan_view_shows_the_last_quality_result_of_the_model() -> None:
    plan = plan_model(read_model(demo_ref_path("demo:llama")), resolve_hardware(), verify=False)
    quality_file(plan.model_name).unlink(missing_ok=True)  # other tests may have measured it
    assert plan_view(plan).quality == ""  # nothing measured yet in this HOMELAB_HOME

    path = str(demo_ref_path("demo:llama"))
    reference = QualityConfig("reference", path, "F16", "f16", "f16", True)
    candidate = QualityConfig("K/V q8_0", path, "F16", "q8_0", "q8_0", True)
    text, source = read_text(None)
    result = measure_quality(
        reference,
        [candidate],
        text,
        model_name=plan.model_name,
        text_source=source,
        plan_key=candidate.key,
        n_ctx=256,
        max_chunks=1,
    )
    save_quality(result)
    try:
        line = plan_view(plan).quality
    finally:  # snapshot tests of the same demo model must not see it
        quality_file(plan.model_name).unlink(missing_ok=True)
    assert line.startswith("[b]Measured quality[/b]")
    assert "KLD" in line and "top-1" in line
