"""What a yield unloads and a resume loads again: the fleet's residents, or ``serve MODEL``'s
one engine (see :mod:`homelab.server.yielding`).

Closing an engine saves each slot's state into the prompt cache and frees its weights, KV
cache and compute buffers; a speculation draft and the connections to RPC workers belong to
the engine and close with it (a worker frees what it held for the engine when the connection
ends). Loading again plans for the hardware detected at resume — the VRAM free *now* — so a
program that still holds part of the GPU gets fewer layers, a shorter context or a smaller
K/V type on our side, and the plan's reasons say so.

With ``--yield-to-cpu`` a yield loads the model again from a CPU-only plan (no layer on a GPU,
no GPU device at all: not even a CUDA context or a compute buffer stays on the card) and
serves from it meanwhile. That plan asks for the GPU plan's cache layout — context per slot,
slots, K/V types, flash attention: what a saved state's key holds (``prompt_cache.key``) — so
the states saved at the yield restore into it, and the CPU engine's states into the GPU
engine on resume; when that layout does not fit the host, the planner chooses freely and the
conversations are prefilled again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import anyio.to_thread

from homelab.server.engine_seam import LoadedEngine
from homelab.server.fleet import Fleet
from homelab.server.yielding import Resumed

if TYPE_CHECKING:
    from homelab.planner.budget import Hardware
    from homelab.planner.plan import Plan
    from homelab.planner.search import PlanRequest


def plan_for_cpu(
    plan_with: Callable[[PlanRequest], Plan], request: PlanRequest, like: Plan
) -> Plan:
    """The CPU-only plan of a yield (``plan_with`` plans a request for the host alone): the
    cache layout of ``like`` (the GPU plan) when it fits, so saved states restore; else the
    planner's own choice. No GPU device is opened (split mode none, main GPU -1)."""
    from homelab.errors import PlanError

    s = like.settings
    same_layout = replace(
        request,
        ctx=s.n_ctx_per_slot,
        parallel=s.n_parallel,
        kv=(s.type_k, s.type_v),
        flash_attn=s.flash_attn,
        swa_full=s.swa_full,
        kv_unified=s.kv_unified,
    )
    try:
        plan = plan_with(same_layout)
    except PlanError:
        plan = plan_with(request)
    no_gpu = replace(plan.settings, n_gpu_layers=0, split_mode="none", main_gpu=-1)
    return replace(plan, settings=no_gpu)


def resumed(model: str, plan: Plan) -> Resumed:
    """The plan a model was loaded with on resume, as the reports show it."""
    s = plan.settings
    return Resumed(
        model=model,
        n_gpu_layers=s.n_gpu_layers,
        n_ctx_per_slot=s.n_ctx_per_slot,
        n_parallel=s.n_parallel,
        type_k=s.type_k,
        type_v=s.type_v,
        device_bytes={d.name: d.total_bytes for d in plan.memory.devices},
        reasons=tuple(plan.reasons),
    )


class FleetResidency:
    """Every model the fleet has loaded: unloaded together, loaded again together."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.unloaded: list[str] = []  # what the last yield unloaded (loaded on resume)

    serves_from_cpu = False  # --yield-to-cpu needs one MODEL (serve refuses it without)

    def engines(self) -> list[Any]:
        return [m.engine for m in self.fleet.residents() if m.engine is not None]

    def planned_bytes(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for model in self.fleet.residents():
            for device, n_bytes in model.device_bytes().items():
                totals[device] = totals.get(device, 0) + n_bytes
        return totals

    async def unload(self, reason: str) -> list[str]:
        self.unloaded = await self.fleet.unload_all(f"yielded: {reason}")
        return list(self.unloaded)

    async def reload(self, hardware: Hardware) -> list[Resumed]:
        self.fleet.hardware = hardware  # the budgets each model is planned against from now on
        loaded = []
        for name in self.unloaded:
            if name in self.fleet.models:  # its file may have gone meanwhile
                model = await self.fleet.load(name)
                assert model.plan is not None
                loaded.append(resumed(name, model.plan))
        self.unloaded = []
        return loaded

    async def load_on_cpu(self, hardware: Hardware) -> list[Resumed]:
        raise NotImplementedError("a fleet does not serve from the CPU while yielded")


class EngineSlot(Protocol):
    """Where ``serve MODEL`` keeps its engine (``runner.EngineHolder``)."""

    engine: Any


class SingleResidency:
    """``serve MODEL``'s engine: closed on yield, planned and loaded again on resume; with
    ``cpu_plan_fn`` (``--yield-to-cpu``: the host-only hardware and the GPU plan -> the CPU
    plan) loaded from a CPU-only plan while yielded."""

    def __init__(
        self,
        holder: EngineSlot,
        name: str,
        plan: Plan,
        plan_fn: Callable[[Hardware], Plan],
        load_fn: Callable[[Plan], LoadedEngine],
        cpu_plan_fn: Callable[[Hardware, Plan], Plan] | None = None,
    ) -> None:
        self.holder = holder
        self.name = name
        self.plan: Plan | None = plan  # the plan of the engine loaded (or last loaded)
        self.gpu_plan = plan  # the last plan made for the GPUs: a CPU plan keeps its layout
        self.plan_fn = plan_fn
        self.load_fn = load_fn
        self.cpu_plan_fn = cpu_plan_fn

    @property
    def serves_from_cpu(self) -> bool:
        return self.cpu_plan_fn is not None

    def engines(self) -> list[Any]:
        return [self.holder.engine] if self.holder.engine is not None else []

    def planned_bytes(self) -> dict[str, int]:
        if self.plan is None or self.holder.engine is None:
            return {}
        return {d.name: d.total_bytes for d in self.plan.memory.devices}

    async def unload(self, reason: str) -> list[str]:
        engine, self.holder.engine = self.holder.engine, None
        if engine is None:
            return []
        await anyio.to_thread.run_sync(engine.close)
        return [self.name]

    async def reload(self, hardware: Hardware) -> list[Resumed]:
        plan = await anyio.to_thread.run_sync(self.plan_fn, hardware)
        self.holder.engine = await anyio.to_thread.run_sync(self.load_fn, plan)
        self.plan = self.gpu_plan = plan
        return [resumed(self.name, plan)]

    async def load_on_cpu(self, hardware: Hardware) -> list[Resumed]:
        """Load the model from a CPU-only plan for ``hardware``'s host (``--yield-to-cpu``)."""
        from homelab.planner.budget import cpu_only

        assert self.cpu_plan_fn is not None
        plan = await anyio.to_thread.run_sync(self.cpu_plan_fn, cpu_only(hardware), self.gpu_plan)
        self.holder.engine = await anyio.to_thread.run_sync(self.load_fn, plan)
        self.plan = plan
        return [resumed(self.name, plan)]
