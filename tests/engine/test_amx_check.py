"""A llama.cpp build whose AMX matrix multiply crashes is refused before a quantized model loads
(``homelab.engine.amx_check``).

This machine's build has no AMX kernels (the Makefile leaves them out), so the crashing build
cannot exist here: where a test needs it, ``at_risk`` is faked, and the crash is a real child
process killed by SIGSEGV. The canary itself runs for real (a child that reads a prompt with
the generated tiny Q8_0 model).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import EngineFactory, tiny_settings

from homelab.engine import amx_check
from homelab.engine.amx_check import CRASHED, OK, UNKNOWN
from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.errors import EngineError
from homelab.hardware.host import read_cpu

SEGFAULT = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
CPUINFO = "processor : 0\nmodel name : Xeon\nflags : fpu sse2 avx2 avx512f {extra}\n"


def test_only_an_amx_cpu_with_a_build_that_has_the_kernels_is_at_risk() -> None:
    with_kernels = "CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | OPENMP = 1 |"
    without = "CPU : SSE3 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | OPENMP = 1 |"
    assert amx_check.at_risk(True, with_kernels)
    assert not amx_check.at_risk(True, without)
    assert not amx_check.at_risk(False, with_kernels)
    assert read_cpu(CPUINFO.format(extra="amx_bf16 amx_tile amx_int8")).has_amx
    assert not read_cpu(CPUINFO.format(extra="avx512_vnni")).has_amx


def test_a_child_killed_by_a_signal_is_a_crash_and_one_that_fails_tells_nothing() -> None:
    assert amx_check.canary_verdict(SEGFAULT) == CRASHED
    assert amx_check.canary_verdict([sys.executable, "-c", "pass"]) == OK
    assert amx_check.canary_verdict([sys.executable, "-c", "raise SystemExit(2)"]) == UNKNOWN
    assert amx_check.canary_verdict(["/no/such/program"]) == UNKNOWN


def test_the_verdict_is_kept_per_build_and_an_unknown_one_is_asked_again(tmp_path: Path) -> None:
    path = tmp_path / "verdicts.json"
    asked: list[str] = []

    def canary(answer: str) -> Callable[[], str]:
        def run() -> str:
            asked.append(answer)
            return answer

        return run

    assert amx_check.verdict(canary(UNKNOWN), path) == UNKNOWN
    assert amx_check.verdict(canary(CRASHED), path) == CRASHED
    assert amx_check.verdict(canary(OK), path) == CRASHED  # recorded: not asked again
    assert asked == [UNKNOWN, CRASHED]
    path.write_text("not json")
    assert amx_check.verdict(canary(OK), path) == OK  # an unreadable record is asked anew


def test_the_canary_reads_a_prompt_with_this_build() -> None:
    """The real child: this machine's build reads the tiny Q8_0 model's prompt."""
    assert amx_check.run_canary() == OK


def test_a_crashing_build_refuses_quantized_models_and_says_how_to_rebuild(
    make_engine: EngineFactory,
    demo_model: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # an AMX CPU with a build that has the kernels: see the module
    monkeypatch.setattr(amx_check, "this_machine_at_risk", lambda: True)
    monkeypatch.setattr(amx_check, "run_canary", lambda: amx_check.canary_verdict(SEGFAULT))
    monkeypatch.setattr(amx_check, "_verdicts_path", lambda: tmp_path / "verdicts.json")
    quantized = demo_model("llama", "tiny", "Q8_0")
    with pytest.raises(EngineError) as refused:
        Engine.load(quantized, tiny_settings(1), record_calibration=False)
    assert "crashes on quantized models" in str(refused.value)
    assert "make -s cmake-args" in (refused.value.hint or "")
    engine = make_engine(n_parallel=1)  # F16 weights never take the AMX path: loaded
    sampling = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    finish = engine.submit(GenerationRequest("f16", "hello", sampling)).collect().finish
    assert finish.stats.completion_tokens == 4
