"""The speculative draft in the plan: its memory next to a real load, refusals, suggestions.

The pair is ``demo:spec:tiny`` / ``demo:spec-draft:tiny`` (one vocabulary by construction);
``demo:reasoning:tiny`` has the same size of vocabulary with two different token texts, and
``demo:bert:tiny`` another tokenizer altogether. The real-load test creates the draft exactly
as the engine does (``DraftModel.load`` beside a real target context) and reads llama.cpp's
log of the draft's buffers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from planner_helpers import cpu_hardware, profile_hardware

from homelab.cli import main
from homelab.engine.speculation.draft_model import DraftModel
from homelab.errors import PlanError
from homelab.gguf.demo import demo_model_path
from homelab.gguf.model import ModelInfo
from homelab.gguf.reader import read_model
from homelab.llamacpp.context import Context, ContextParams
from homelab.llamacpp.model import Model
from homelab.planner.budget import HOST_MARGIN_BYTES, Hardware, host_device
from homelab.planner.draft import draft_settings, vocabulary
from homelab.planner.dryrun import parse_log
from homelab.planner.memory import MemoryModel
from homelab.planner.plan import plan_model
from homelab.planner.render import render_plan
from homelab.planner.search import PlanRequest
from homelab.settings import Settings

MIB = 1 << 20
_MODEL_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB")


def demo_path(name: str) -> Path:
    return demo_model_path(name, "tiny", "F16")


@pytest.fixture(scope="module")
def target() -> ModelInfo:
    return read_model(demo_path("spec"))


@pytest.fixture(scope="module")
def draft() -> ModelInfo:
    return read_model(demo_path("spec-draft"))


@pytest.fixture(scope="module")
def target_model() -> Iterator[Model]:
    with Model.load(demo_path("spec")) as model:
        yield model


def mib(n_bytes: int) -> str:
    return f"{n_bytes / MIB:.2f}"


# --- the draft's bytes against llama.cpp -----------------------------------------------------


@pytest.mark.parametrize(
    ("kv", "slots", "n_ctx"),
    [("f16", 1, 4096), ("q8_0", 3, 3072), ("q4_0", 2, 8192), ("f16", 4, 1024)],
)
def test_planned_draft_bytes_equal_what_llama_cpp_allocates_for_it(
    target_model: Model, target: ModelInfo, draft: ModelInfo, kv: str, slots: int, n_ctx: int
) -> None:
    settings = Settings(
        n_ctx=n_ctx, n_ctx_per_slot=n_ctx // slots, n_parallel=slots, type_k=kv, type_v=kv,
        flash_attn=True,
    )  # fmt: skip
    planned = MemoryModel(target, draft=MemoryModel(draft)).estimate(settings, cpu_hardware())
    assert planned.draft is not None
    with Context.create(target_model, ContextParams.from_settings(settings)) as context:
        loaded = DraftModel.load(
            draft.source, target_model.vocab, context.params, n_gpu_layers=0, catch_up_tokens=64
        )
        try:
            logged = parse_log(loaded.context.creation_log)
            buffers = {m[1]: float(m[2]) for m in _MODEL_BUFFER.finditer(loaded.model.load_log)}
        finally:
            loaded.close()
    # the draft's cache has the target's slot layout, byte for byte at the log's resolution
    assert mib(planned.draft.kv_bytes) == f"{logged.kv_mib:.2f}"
    assert logged.kv_caches[0].cells == n_ctx // slots  # one stream per slot
    assert mib(planned.draft.weights_bytes) == f"{buffers['CPU_Mapped']:.2f}"
    assert mib(planned.draft.overhead_bytes) == f"{logged.output_mib['CPU']:.2f}"
    real = logged.compute_mib["CPU"]
    formula = planned.draft.compute_bytes / MIB
    assert abs(formula - real) <= max(0.5, 0.05 * real), f"{formula:.2f} vs {real:.2f} MiB"
    # and all of it is in the host's total
    assert planned.devices[0].draft_bytes == planned.draft.total_bytes


def test_draft_settings_are_the_targets_context_with_a_full_window(draft: ModelInfo) -> None:
    settings = Settings(n_ctx=4096, n_parallel=2, type_k="q8_0", type_v="q8_0", n_cpu_moe=3)
    drafted = draft_settings(settings, draft)
    assert (drafted.n_ctx, drafted.n_parallel, drafted.type_k) == (4096, 2, "q8_0")
    assert drafted.swa_full and drafted.n_cpu_moe == 0 and drafted.quant == draft.file_type


# --- the plan --------------------------------------------------------------------------------


def test_a_plan_with_a_draft_counts_it_and_shows_what_it_costs(
    target: ModelInfo, draft: ModelInfo
) -> None:
    hardware = cpu_hardware()
    alone = plan_model(target, hardware, PlanRequest(ctx=4096), verify=False)
    both = plan_model(target, hardware, PlanRequest(ctx=4096, draft=draft), verify=False)
    assert both.settings == alone.settings
    assert both.memory.draft is not None and both.memory.draft_bytes > 0
    assert both.memory.total_bytes == alone.memory.total_bytes + both.memory.draft_bytes
    assert both.to_dict()["memory"]["draft_bytes"] == both.memory.draft_bytes
    assert both.to_dict()["draft"]["name"] == draft.name
    assert all(row.max_ctx_without_draft is not None for row in both.capacity)
    text = render_plan(both)
    assert f"draft {draft.name}"[:30] in text and "without draft" in text
    assert any(reason.startswith(f"draft {draft.name}") for reason in both.reasons)


def test_the_draft_goes_to_the_gpu_with_the_target(target: ModelInfo, draft: ModelInfo) -> None:
    """A fake GPU (a profile, no NVML): every layer of both models is offloaded."""
    plan = plan_model(target, profile_hardware(), PlanRequest(draft=draft), verify=False)
    host, gpu = plan.memory.devices
    assert plan.memory.draft is not None
    assert gpu.draft_bytes > host.draft_bytes
    assert plan.memory.draft.device(gpu.name).overhead_bytes == gpu.overhead_bytes
    assert gpu.draft_bytes < plan.memory.draft.device(gpu.name).total_bytes  # one CUDA runtime


def test_the_draft_costs_context_when_memory_is_tight(target: ModelInfo, draft: ModelInfo) -> None:
    budget = MemoryModel(target).estimate(
        Settings(n_ctx=2048, n_ctx_per_slot=2048, flash_attn=True), cpu_hardware()
    )
    hardware = cpu_hardware_bytes(budget.total_bytes + 4 * MIB)
    plan = plan_model(target, hardware, PlanRequest(ctx=256, draft=draft), verify=False)
    chosen = next(row for row in plan.capacity if row.chosen)
    assert chosen.max_ctx_without_draft is not None
    assert chosen.max_ctx < chosen.max_ctx_without_draft


def cpu_hardware_bytes(n_bytes: int) -> Hardware:
    """A host whose budget (after the system margin) is ``n_bytes``."""
    return Hardware((host_device(n_bytes + HOST_MARGIN_BYTES, "test"),), "cpu")


def test_a_plan_that_fits_only_without_the_draft_says_so(
    target: ModelInfo, draft: ModelInfo
) -> None:
    settings = Settings(
        n_ctx=4096, n_ctx_per_slot=4096, type_k="q4_0", type_v="q4_0", flash_attn=True
    )
    alone = MemoryModel(target).estimate(settings, cpu_hardware())
    hardware = cpu_hardware_bytes(alone.total_bytes + MIB)
    request = PlanRequest(ctx=4096, kv=("q4_0", "q4_0"), n_ubatch=512)
    assert plan_model(target, hardware, request, verify=False).fits
    with pytest.raises(PlanError) as failure:
        plan_model(target, hardware, replace(request, draft=draft), verify=False)
    assert f"draft {draft.name}" in str(failure.value)
    assert "drop --draft" in (failure.value.hint or "")


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("other", "problem"),
    [("reasoning", "token 1022 is b'<think>'"), ("bert", "bos_token_id"), ("mamba", "recurrent")],
)
def test_a_draft_the_engine_could_not_use_is_refused_at_plan_time(
    target: ModelInfo, other: str, problem: str
) -> None:
    wrong = read_model(demo_path(other) if other != "mamba" else demo_model_path("mamba"))
    with pytest.raises(PlanError, match=re.escape(problem)):
        plan_model(target, cpu_hardware(), PlanRequest(draft=wrong), verify=False)


def test_vocabulary_reads_the_token_texts_from_the_header(target: ModelInfo) -> None:
    vocab = vocabulary(target.source)
    assert vocab is not None and len(vocab.tokens) == target.n_vocab
    assert vocab.tokenizer_model == target.tokenizer_model
    assert vocabulary(Path(target.source).with_suffix(".missing")) is None


# --- suggestions -----------------------------------------------------------------------------


def test_the_plan_suggests_a_smaller_model_with_the_same_vocabulary(target: ModelInfo) -> None:
    library = [
        (name, read_model(demo_path(name))) for name in ("spec", "spec-draft", "reasoning", "bert")
    ]
    plan = plan_model(target, cpu_hardware(), PlanRequest(), verify=False, draft_candidates=library)
    assert plan.draft_suggestion is not None
    assert plan.draft_suggestion.startswith("draft suggestion: --draft spec-draft (same vocabulary")
    assert plan.draft_suggestion in plan.reasons
    no_draft = plan_model(
        target, cpu_hardware(), PlanRequest(), verify=False, draft_candidates=library[2:]
    )
    assert no_draft.draft_suggestion is None


def test_homelab_plan_suggests_a_draft_from_the_library_and_takes_draft(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "spec-draft-tiny.gguf").symlink_to(demo_path("spec-draft"))
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(tmp_path))
    assert main(["plan", str(demo_path("spec")), "--no-verify"]) == 0
    out = capsys.readouterr().out
    match = re.search(r"draft suggestion: --draft (\S+) \(same vocabulary, \+[\d.]+ MiB\)", out)
    assert match, out
    assert main(["plan", str(demo_path("spec")), "--draft", match[1]]) == 0
    out = capsys.readouterr().out
    assert "draft kv_bytes" in out and "without draft" in out
