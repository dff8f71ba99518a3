"""The per-step timing breakdown (debug metrics): an engine started with
``HOMELAB_PROFILE_STEPS=1`` times each phase of its steps and reports mean µs per step in
its metrics and in the server's ``/metrics``; without it, no phase is timed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from engine_helpers import EngineFactory

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import PROFILE_STEPS_ENV
from homelab.engine.metrics import STEP_PHASES
from homelab.server.metrics import ServerMetrics

SAMPLING = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def test_a_profiled_engine_reports_where_each_step_goes(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILE_STEPS_ENV, "1")
    engine = make_engine(n_parallel=2)
    engine.submit(GenerationRequest("a", "hello world", SAMPLING)).collect()
    phases = engine.metrics().step_phases_us
    assert phases is not None and set(phases) == set(STEP_PHASES)
    assert phases["decode"] > 0 and phases["sample"] > 0 and phases["emit"] > 0
    assert phases["detokenize"] > 0 and phases["handoff"] > 0  # timed per token
    assert phases["stop"] == 0  # no stop strings: the matcher never ran
    with_stops = replace(SAMPLING, stop=("never in this text",))
    engine.submit(GenerationRequest("b", "hello world", with_stops)).collect()
    phases = engine.metrics().step_phases_us
    assert phases is not None and phases["stop"] > 0
    assert phases["draft"] >= 0  # no speculator: only the call
    exposition = ServerMetrics().render(engine.metrics(), "tiny")
    assert 'homelab_step_phase_seconds{model="tiny",phase="decode"}' in exposition


def test_an_engine_that_does_not_profile_reports_no_phases(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    engine.submit(GenerationRequest("a", "hello", SAMPLING)).collect()
    assert engine.metrics().step_phases_us is None
    assert "homelab_step_phase_seconds" not in ServerMetrics().render(engine.metrics(), "tiny")
