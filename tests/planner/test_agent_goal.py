"""``--goal agent``: the context a coding agent needs (64K), reached with the best KV type that
gets there — a quantized cache only when the better ones fall short, and the plan says so."""

from __future__ import annotations

from dataclasses import replace

from planner_helpers import profile_hardware

from homelab.gguf.catalogue import find_model
from homelab.models.ref import resolve
from homelab.planner.budget import Hardware
from homelab.planner.memory import MemoryModel
from homelab.planner.plan import Plan, plan_model
from homelab.planner.search import AGENT_CONTEXT, GOALS, PlanRequest
from homelab.settings import Settings


def plan(model: str, hardware: Hardware, **request: object) -> Plan:
    variants = resolve(model).variants()
    return plan_model(variants, hardware, PlanRequest(**request), verify=False)  # type: ignore[arg-type]


def fits(slug: str, settings: Settings, hardware: Hardware) -> bool:
    model = find_model(slug).model_info(settings.quant)
    return MemoryModel(model).estimate(settings, hardware).fits


def agent_reason(result: Plan) -> str:
    return next(r for r in result.reasons if r.startswith("goal agent"))


def test_agent_is_a_goal_every_verb_offers() -> None:
    assert "agent" in GOALS


def test_a_quantized_cache_is_chosen_when_f16_cannot_reach_64k() -> None:
    hardware = profile_hardware("rtx-3060-12gb")
    result = plan("llama-3.1-8b", hardware, goal="agent", quant="Q8_0")
    s = result.settings
    assert s.n_ctx_per_slot >= AGENT_CONTEXT and (s.type_k, s.type_v) != ("f16", "f16")
    for better in ("f16", "q8_0"):
        if better == s.type_k:
            break
        at_64k = replace(s, type_k=better, type_v=better, n_parallel=1, n_ctx=AGENT_CONTEXT,
                         n_ctx_per_slot=AGENT_CONTEXT)  # fmt: skip
        assert not fits("llama-3.1-8b", at_64k, hardware)  # the better type falls short
    reason = agent_reason(result)
    assert "because the better types reach less than 65536" in reason
    assert "f16/f16" in reason and "q4_0/q4_0" in reason  # the reach of every KV type


def test_the_best_kv_type_when_it_reaches_64k_and_the_longest_context_it_reaches() -> None:
    hardware = profile_hardware("rtx-4090")
    result = plan("llama-3.1-8b", hardware, goal="agent", quant="Q4_K_M")
    s = result.settings
    assert (s.type_k, s.type_v) == ("f16", "f16") and s.n_ctx_per_slot >= AGENT_CONTEXT
    longer = replace(
        s, n_ctx_per_slot=s.n_ctx_per_slot + 256, n_ctx=(s.n_ctx_per_slot + 256) * s.n_parallel
    )
    assert s.n_ctx_per_slot == 131072 or not fits("llama-3.1-8b", longer, hardware)
    assert s.n_parallel <= 2 and "the best type" in agent_reason(result)


def test_a_model_trained_shorter_than_64k_gets_its_trained_context() -> None:
    result = plan("qwen2.5-coder-32b", profile_hardware("rtx-4090"), goal="agent")
    assert result.settings.n_ctx_per_slot == result.trained_context == 32768
    assert "an agent needs 32768" in agent_reason(result)


def test_fixed_knobs_hold_under_the_agent_goal() -> None:
    result = plan(
        "llama-3.1-8b", profile_hardware("rtx-4090"), goal="agent", quant="Q4_K_M",
        kv=("q8_0", "q8_0"), parallel=3,
    )  # fmt: skip
    s = result.settings
    assert (s.type_k, s.n_parallel) == ("q8_0", 3) and s.n_ctx_per_slot >= AGENT_CONTEXT
