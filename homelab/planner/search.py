"""The joint search: weight quant, KV types, context, slots, offload, flash attention, n_ubatch.

Every candidate is checked with the memory model on every device against its budget. The
search prefers, in this order: keeping all layers on the GPU (partial offload costs most of
the decode speed), the best weight quant that reaches the minimum the user asked for, then
whatever the goal optimises:

* ``context`` (default): the longest per-slot context up to the model's trained context; the
  KV type that reaches furthest wins, ties go to the better KV type.
* ``quality``: the best quant, then the best KV type, that reach ``--ctx``.
* ``agent``: a coding agent's session (Claude Code, Codex, OpenCode): the best KV type that
  reaches ``--ctx`` or 64K (the trained context if shorter) — a quantized K/V only when the
  better ones fall short, and the reasons say so — at the longest context it reaches, with
  two slots when both reach it (else one); when no KV type reaches it, goal ``context``.
* ``throughput``: the workload ``--parallel`` × ``--ctx`` at the best quant; without
  ``--parallel``, as many slots as fit (the KV type that fits most wins).

Knobs the user fixed (``PlanRequest``) are never changed. Only when nothing fits with every
layer on the GPU does the search move MoE experts (``n_cpu_moe``) and then whole layers to the
CPU. When nothing fits at all, :class:`PlanError` names the binding device and what would fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from homelab.errors import PlanError
from homelab.gguf.model import ModelInfo
from homelab.gguf.projector import ProjectorInfo
from homelab.planner.budget import Hardware
from homelab.planner.cache import CTX_PAD, pad
from homelab.planner.memory import MemoryEstimate, MemoryModel
from homelab.planner.placement import check_split_mode
from homelab.planner.predict import roofline_decode_tok_s
from homelab.planner.projector import ProjectorCost, projector_settings
from homelab.planner.rules import (
    DEFAULT_KV_PAIRS,
    KvPair,
    kv_label,
    kv_pair_problem,
    kv_quality,
    wants_flash_attn,
)
from homelab.settings import Settings
from homelab.units import format_gib

GOALS = ("context", "quality", "throughput", "agent")
AGENT_CONTEXT = 65_536  # a coding agent's tool prompt and history (Ollama asks as much)
AGENT_SLOTS = (2, 1)  # the conversation keeps its slot while probes and titles use another
DEFAULT_MIN_CONTEXT = 4096
DEFAULT_QUALITY_CONTEXT = 8192
DEFAULT_THROUGHPUT_CONTEXT = 4096
MAX_SLOTS = 64
DEFAULT_UBATCHES = (512, 256)
PARTIAL_OFFLOAD_MIN_SPEED_SHARE = 0.75  # longer context may cost at most 25% of decode speed
KV_SPEED_TOLERANCE = 0.95  # partial offload: a better KV type may cost up to 5% of speed
FALLBACK_MIN_SPEED_SHARE = 0.5  # a partially offloaded quant must keep half the fastest's speed
CAPACITY_LIMIT_TOKENS = 1 << 20


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for; every field that is not None is a fixed knob."""

    goal: str = "context"
    ctx: int | None = None  # per-slot context (each request's)
    parallel: int | None = None
    kv: KvPair | None = None
    quant: str | None = None
    n_gpu_layers: int | None = None
    n_cpu_moe: int | None = None
    flash_attn: bool | None = None
    n_ubatch: int | None = None
    swa_full: bool = False
    kv_unified: bool = False
    split_mode: str = "layer"  # --split-mode layer|row|none (see planner.placement)
    main_gpu: int = 0  # --main-gpu: the offload device of split mode none
    draft: ModelInfo | None = None  # --draft: a speculative draft loaded beside the model
    mmproj_path: str | None = None  # --mmproj PATH (homelab.models resolves it into projector)
    no_mmproj: bool = False  # --no-mmproj: no projector, even with one beside the model
    projector: ProjectorInfo | None = None  # the vision projector (mmproj) loaded with it
    mmproj_offload: bool | None = None  # its device: None = the GPU when it fits there
    image_max_tokens: int = 0  # --image-max-tokens (0: the projector's own maximum)
    projector_cost: ProjectorCost | None = None  # set by plan_model: the projector placed


@dataclass(frozen=True)
class Choice:
    """One evaluated configuration."""

    memory: MemoryModel
    settings: Settings
    estimate: MemoryEstimate

    @property
    def model(self) -> ModelInfo:
        return self.memory.model


@dataclass(frozen=True)
class SearchResult:
    choice: Choice
    reasons: tuple[str, ...]


def order_by_quality(models: Sequence[ModelInfo]) -> list[ModelInfo]:
    """Quant variants best first: more bits per weight is better."""
    return sorted(models, key=lambda m: -m.weights_bytes / max(m.n_params, 1))


def select_quant(models: Sequence[ModelInfo], quant: str | None) -> list[ModelInfo]:
    ordered = order_by_quality(models)
    if quant is None:
        return ordered
    chosen = [m for m in ordered if m.file_type.lower() == quant.strip().lower()]
    if not chosen:
        known = ", ".join(m.file_type for m in ordered)
        raise PlanError(f"No {quant} file of this model is available.", hint=f"Available: {known}.")
    return chosen


class Search:
    """One planning run over the quant variants of one model."""

    def __init__(self, models: Sequence[ModelInfo], hardware: Hardware, request: PlanRequest):
        if request.goal not in GOALS:
            raise PlanError(
                f"Unknown goal {request.goal!r}.", hint=f"Use one of {', '.join(GOALS)}."
            )
        self.hardware = hardware
        self.request = request
        check_split_mode(request.split_mode, request.main_gpu, hardware)
        self.models = list(models)
        draft = MemoryModel(request.draft) if request.draft is not None else None
        projector = request.projector_cost
        self.candidates = [
            MemoryModel(m, draft=draft, projector=projector)
            for m in select_quant(models, request.quant)
        ]
        self.all_quants = [m.file_type for m in order_by_quality(models)]
        self.reasons: list[str] = []

    # --- settings ----------------------------------------------------------------------

    def flash_attn(self, memory: MemoryModel, pair: KvPair) -> bool:
        if self.request.flash_attn is not None:
            return self.request.flash_attn
        return wants_flash_attn(memory.model, self.hardware, pair, self.request.n_gpu_layers)

    def pairs(self, memory: MemoryModel) -> list[KvPair]:
        """The KV pairs allowed for this model, best first."""
        if self.request.kv is not None:
            problem = kv_pair_problem(
                memory.model,
                self.hardware,
                self.request.kv,
                self.flash_attn(memory, self.request.kv),
            )
            if problem:
                raise PlanError(f"--kv {kv_label(self.request.kv)} cannot be used: {problem}.")
            return [self.request.kv]
        allowed = [
            p
            for p in DEFAULT_KV_PAIRS
            if not kv_pair_problem(memory.model, self.hardware, p, self.flash_attn(memory, p))
        ]
        return sorted(allowed, key=kv_quality, reverse=True)

    def ubatches(self) -> tuple[int, ...]:
        return (self.request.n_ubatch,) if self.request.n_ubatch else DEFAULT_UBATCHES

    def base(self, memory: MemoryModel, pair: KvPair, n_parallel: int, n_ubatch: int) -> Settings:
        """Settings with every layer on the GPU (or the user's offload) and the smallest context."""
        if not self.hardware.has_gpu:
            n_gpu_layers = 0
        elif self.request.n_gpu_layers is not None:
            n_gpu_layers = self.request.n_gpu_layers
        else:
            n_gpu_layers = memory.full_offload_layers
        settings = Settings(
            quant=memory.model.file_type,
            n_ctx=CTX_PAD * n_parallel,
            n_ctx_per_slot=CTX_PAD,
            n_parallel=n_parallel,
            type_k=pair[0],
            type_v=pair[1],
            flash_attn=self.flash_attn(memory, pair),
            n_gpu_layers=n_gpu_layers,
            n_cpu_moe=self.request.n_cpu_moe or 0,
            n_ubatch=n_ubatch,
            swa_full=self.request.swa_full,
            kv_unified=self.request.kv_unified,
            rpc_servers=self.hardware.rpc_endpoints,
            tensor_split=self.hardware.tensor_split() if self.request.split_mode != "none" else (),
            split_mode=self.request.split_mode,
            main_gpu=self.request.main_gpu,
        )
        return projector_settings(settings, self.request.projector_cost)

    @staticmethod
    def with_ctx(settings: Settings, per_slot: int) -> Settings:
        per_slot = pad(max(per_slot, 1))
        return replace(settings, n_ctx=per_slot * settings.n_parallel, n_ctx_per_slot=per_slot)

    @staticmethod
    def with_slots(settings: Settings, n_parallel: int) -> Settings:
        per_slot = settings.n_ctx_per_slot
        return replace(settings, n_parallel=n_parallel, n_ctx=per_slot * n_parallel)

    def evaluate(self, memory: MemoryModel, settings: Settings) -> Choice:
        return Choice(memory, settings, memory.estimate(settings, self.hardware))

    def fits(self, memory: MemoryModel, settings: Settings) -> bool:
        return memory.estimate(settings, self.hardware).fits

    # --- the searches over one dimension ----------------------------------------------

    def max_ctx(self, memory: MemoryModel, settings: Settings, cap: int) -> int:
        """The longest per-slot context (a multiple of 256, at most ``cap``) that fits; 0: none."""
        most = max(cap // CTX_PAD, 1)  # never past the cap (llama.cpp pads n_ctx up to 256)
        return CTX_PAD * _largest(
            1, most, lambda k: self.fits(memory, self.with_ctx(settings, k * CTX_PAD))
        )

    def max_slots(self, memory: MemoryModel, settings: Settings) -> int:
        return _largest(1, MAX_SLOTS, lambda n: self.fits(memory, self.with_slots(settings, n)))

    def offload_to_fit(self, memory: MemoryModel, settings: Settings) -> Settings | None:
        """The least CPU offload that makes ``settings`` fit (experts first, then layers)."""
        if self.fits(memory, settings):
            return settings
        if not self.hardware.has_gpu or self.request.n_gpu_layers is not None:
            return None
        trunk = memory.geometry.n_layer_trunk
        if memory.model.is_moe and self.request.n_cpu_moe is None:
            n = _smallest(
                1, trunk, lambda k: self._gpu_fits(memory, replace(settings, n_cpu_moe=k))
            )
            if n and self.fits(memory, replace(settings, n_cpu_moe=n)):
                return replace(settings, n_cpu_moe=n)
        top = memory.full_offload_layers - 1
        ngl = _largest(
            0, top, lambda k: self._gpu_fits(memory, replace(settings, n_gpu_layers=k)), empty=-1
        )
        if ngl >= 0 and self.fits(memory, replace(settings, n_gpu_layers=ngl)):
            return replace(settings, n_gpu_layers=ngl)
        return None

    def _gpu_fits(self, memory: MemoryModel, settings: Settings) -> bool:
        estimate = memory.estimate(settings, self.hardware)
        return all(d.fits for d in estimate.devices if d.kind == "gpu")

    def decode_tok_s(self, choice: Choice) -> float:
        return roofline_decode_tok_s(
            choice.memory, choice.settings, self.hardware, min(choice.settings.n_ctx_per_slot, 4096)
        )

    # --- goals ------------------------------------------------------------------------

    def trained_ctx(self, memory: MemoryModel) -> int:
        return max(memory.model.context_length, CTX_PAD)

    def slots(self) -> int:
        return self.request.parallel or 1

    def run(self) -> SearchResult:
        goal = {
            "context": self.goal_context,
            "quality": self.goal_quality,
            "throughput": self.goal_throughput,
            "agent": self.goal_agent,
        }
        choice = goal[self.request.goal]() or self.partial_offload()
        if choice is None:
            raise self.failure()
        return SearchResult(choice, tuple(self.reasons))

    def goal_context(self) -> Choice | None:
        for memory in self.candidates:
            cap = max(self.trained_ctx(memory), self.request.ctx or 0)
            minimum = self.request.ctx or min(DEFAULT_MIN_CONTEXT, cap)
            for n_ubatch in self.ubatches():
                options = []
                for pair in self.pairs(memory):
                    base = self.base(memory, pair, self.slots(), n_ubatch)
                    ctx = self.max_ctx(memory, base, cap)
                    if ctx >= minimum:
                        options.append((ctx, kv_quality(pair), self.with_ctx(base, ctx)))
                if options:
                    ctx, _, settings = max(options, key=lambda o: (o[0], o[1]))
                    choice = self.evaluate(memory, settings)
                    self.note_context_choice(choice, options, cap, minimum)
                    return self.maybe_trade_speed_for_context(choice, cap)
        return None

    def goal_agent(self) -> Choice | None:
        for memory in self.candidates:
            cap = max(self.trained_ctx(memory), self.request.ctx or 0)
            target = self.request.ctx or min(AGENT_CONTEXT, cap)
            for n_ubatch in self.ubatches():
                reach = self.reach_per_kv(memory, n_ubatch, cap)
                picked = next(((p, n, c) for p, n, c in reach if c >= target), None)
                if picked is not None:
                    pair, n_parallel, ctx = picked
                    settings = self.with_ctx(self.base(memory, pair, n_parallel, n_ubatch), ctx)
                    self.note_agent_choice(settings, reach, target)
                    return self.evaluate(memory, settings)
        self.reasons.append(
            "goal agent: no KV type reaches the context an agent needs on this machine; "
            "planned for the longest context that fits instead (goal context)"
        )
        return self.goal_context()

    def reach_per_kv(
        self, memory: MemoryModel, n_ubatch: int, cap: int
    ) -> list[tuple[KvPair, int, int]]:
        """(KV pair, slots, longest context per slot) for each pair (best first) and slot
        count (more first), every layer on the GPU."""
        slot_counts = (self.request.parallel,) if self.request.parallel else AGENT_SLOTS
        return [
            (pair, n, self.max_ctx(memory, self.base(memory, pair, n, n_ubatch), cap))
            for pair in self.pairs(memory)
            for n in slot_counts
        ]

    def note_agent_choice(
        self, settings: Settings, reach: list[tuple[KvPair, int, int]], target: int
    ) -> None:
        chosen = (settings.type_k, settings.type_v)
        per_kv = ", ".join(
            f"{kv_label(p)} {c} × {n} slot{'s' if n > 1 else ''}" for p, n, c in reach
        )
        better = [p for p, _, c in reach if kv_quality(p) > kv_quality(chosen)]
        why = (
            f"K/V {kv_label(chosen)} because the better types reach less than {target} tokens"
            if better
            else f"K/V {kv_label(chosen)}, the best type"
        )
        self.reasons.append(
            f"goal agent: {settings.n_ctx_per_slot} tokens per slot × {settings.n_parallel} "
            f"(an agent needs {target}); {why} (reachable per KV type: {per_kv})"
        )

    def goal_quality(self) -> Choice | None:
        for memory in self.candidates:
            ctx = self.request.ctx or min(DEFAULT_QUALITY_CONTEXT, self.trained_ctx(memory))
            for n_ubatch in self.ubatches():
                for pair in self.pairs(memory):
                    settings = self.with_ctx(self.base(memory, pair, self.slots(), n_ubatch), ctx)
                    if self.fits(memory, settings):
                        self.reasons.append(
                            "goal quality: the best quant and KV type that hold "
                            f"{settings.n_ctx_per_slot} tokens per slot with every layer on the GPU"
                        )
                        return self.evaluate(memory, settings)
        return None

    def goal_throughput(self) -> Choice | None:
        for memory in self.candidates:
            ctx = self.request.ctx or min(DEFAULT_THROUGHPUT_CONTEXT, self.trained_ctx(memory))
            for n_ubatch in self.ubatches():
                options = []
                for pair in self.pairs(memory):
                    settings = self.with_ctx(self.base(memory, pair, self.slots(), n_ubatch), ctx)
                    if not self.fits(memory, settings):
                        continue
                    if self.request.parallel is None:
                        settings = self.with_slots(settings, self.max_slots(memory, settings))
                    options.append((settings.n_parallel, kv_quality(pair), settings))
                if options:
                    slots, _, settings = max(options, key=lambda o: (o[0], o[1]))
                    most = (
                        "" if self.request.parallel else f" (the most that fit, up to {MAX_SLOTS})"
                    )
                    self.reasons.append(
                        f"goal throughput: {slots} slots × {settings.n_ctx_per_slot} tokens fit "
                        f"with every layer on the GPU{most}"
                    )
                    return self.evaluate(memory, settings)
        return None

    def partial_offload(self) -> Choice | None:
        """Nothing fits with every layer on the GPU: keep the least on the CPU.

        Per quant, the KV type that keeps the most on the GPU; across quants, the best quant
        that keeps at least half the decode speed of the fastest one (Q8_0 with most layers on
        the CPU is rarely what anyone wants).
        """
        best_per_quant = [option for option in map(self.best_offload, self.candidates) if option]
        if not best_per_quant:
            return None
        fastest = max(speed for speed, _ in best_per_quant)
        speed, choice = next(
            o for o in best_per_quant if o[0] >= FALLBACK_MIN_SPEED_SHARE * fastest
        )
        if self.hardware.has_gpu:
            self.reasons.append(self.offload_note(choice, speed, fastest))
        return choice

    def best_offload(self, memory: MemoryModel) -> tuple[float, Choice] | None:
        ctx = self.fallback_ctx(memory)
        options = []
        for pair in self.pairs(memory):
            for n_ubatch in self.ubatches():
                base = self.with_ctx(self.base(memory, pair, self.slots(), n_ubatch), ctx)
                settings = self.offload_to_fit(memory, base)
                if settings is not None:
                    choice = self.evaluate(memory, settings)
                    options.append((self.decode_tok_s(choice), kv_quality(pair), choice))
                    break
        if not options:
            return None
        # the best KV type within 5% of the fastest: a smaller cache that buys one more GPU
        # layer is not worth its quality cost
        fastest = max(o[0] for o in options)
        speed, _, choice = max(
            (o for o in options if o[0] >= KV_SPEED_TOLERANCE * fastest), key=lambda o: o[1]
        )
        return speed, choice

    def fallback_ctx(self, memory: MemoryModel) -> int:
        if self.request.ctx:
            return self.request.ctx
        default = DEFAULT_QUALITY_CONTEXT if self.request.goal == "quality" else DEFAULT_MIN_CONTEXT
        return min(default, self.trained_ctx(memory))

    # --- reasons ------------------------------------------------------------------------

    def note_context_choice(
        self, choice: Choice, options: list[tuple[int, float, Settings]], cap: int, minimum: int
    ) -> None:
        settings = choice.settings
        reach = ", ".join(
            f"{kv_label((s.type_k, s.type_v))} {ctx}"
            for ctx, _, s in sorted(options, key=lambda o: -o[1])
        )
        limit = (
            "the model's trained context"
            if settings.n_ctx_per_slot >= self.trained_ctx(choice.memory)
            else "what memory allows"
        )
        self.reasons.append(
            f"goal context: {settings.n_ctx_per_slot} tokens per slot is {limit} "
            f"(reachable per KV type: {reach}; minimum asked: {minimum})"
        )

    def maybe_trade_speed_for_context(self, choice: Choice, cap: int) -> Choice:
        """If the trained context needs layers on the CPU, take it only when it stays fast."""
        settings = choice.settings
        if (
            not self.hardware.has_gpu
            or settings.n_ctx_per_slot >= cap
            or self.request.n_gpu_layers is not None
        ):
            return choice
        longer = self.offload_to_fit(choice.memory, self.with_ctx(settings, cap))
        if longer is None:
            return choice
        longer_choice = self.evaluate(choice.memory, longer)
        fast, slow = self.decode_tok_s(choice), self.decode_tok_s(longer_choice)
        moved = self.describe_offload(longer_choice)
        if slow >= PARTIAL_OFFLOAD_MIN_SPEED_SHARE * fast:
            self.reasons.append(
                f"took {cap} tokens by moving {moved} to the CPU: predicted decode "
                f"{fast:.0f} -> {slow:.0f} tok/s, a cost worth the longer context"
            )
            return longer_choice
        self.reasons.append(
            f"kept every layer on the GPU: {cap} tokens would need {moved} on the CPU, "
            f"cutting predicted decode from {fast:.0f} to {slow:.0f} tok/s"
        )
        return choice

    def describe_offload(self, choice: Choice) -> str:
        settings = choice.settings
        full = choice.memory.full_offload_layers
        if settings.n_gpu_layers < full:
            return f"{full - settings.n_gpu_layers} of {full} layers"
        return (
            f"the experts of {settings.n_cpu_moe} of {choice.memory.geometry.n_layer_trunk} layers"
        )

    def offload_note(self, choice: Choice, speed: float, fastest: float) -> str:
        faster = (
            "" if speed >= fastest else f"; the fastest smaller quant would reach {fastest:.1f}"
        )
        return (
            f"nothing fits with every layer on the GPU, so {self.describe_offload(choice)} stay on "
            f"the CPU: predicted decode {speed:.1f} tok/s{faster}; the context stays at "
            f"{choice.settings.n_ctx_per_slot} tokens, since more would move more to the CPU"
        )

    # --- failure ------------------------------------------------------------------------

    def failure(self) -> PlanError:
        memory = self.candidates[-1]  # the smallest quant allowed
        pairs = self.pairs(memory)
        pair = pairs[-1] if pairs else ("f16", "f16")
        settings = self.with_ctx(
            self.base(memory, pair, self.slots(), self.ubatches()[-1]), self.fallback_ctx(memory)
        )
        what = (
            f"{memory.model.name} {memory.model.file_type} with {kv_label(pair)} KV and "
            f"{settings.n_parallel} slot(s) × {settings.n_ctx_per_slot} tokens"
        )
        lines = [f"Nothing fits: {what}."]
        lines.append(
            self.shortfall(
                memory, settings, "with every layer on the GPU" if self.hardware.has_gpu else ""
            )
        )
        if self.hardware.has_gpu and self.request.n_gpu_layers is None:
            lines.append(
                self.shortfall(
                    memory, replace(settings, n_gpu_layers=0), "with every layer on the CPU"
                )
            )
        hint = self.what_would_fit(memory, pair) + _quantize_hint(memory.model)
        if memory.draft is not None:
            hint = self.without_draft_hint(memory, settings) + " " + hint
        return PlanError(" ".join(lines), hint=hint)

    def without_draft_hint(self, memory: MemoryModel, settings: Settings) -> str:
        """What the draft costs, and whether the model alone would fit."""
        assert memory.draft is not None
        cost = memory.estimate(settings, self.hardware).draft_bytes
        name = memory.draft.model.name
        try:
            Search(self.models, self.hardware, replace(self.request, draft=None)).run()
        except PlanError:
            return f"The draft {name} costs {_gib(cost)}; even without it nothing fits."
        return f"Without the draft {name} (it costs {_gib(cost)}) the model fits: drop --draft."

    def shortfall(self, memory: MemoryModel, settings: Settings, how: str) -> str:
        estimate = memory.estimate(settings, self.hardware)
        device = min(estimate.devices, key=lambda d: d.headroom_bytes)
        subject = f"{how[:1].upper()}{how[1:]}, it" if how else "It"
        return (
            f"{subject} needs {_gib(device.total_bytes)} on "
            f"{device.name} ({device.label}, budget {_gib(device.budget_bytes)}): weights "
            f"{_gib(device.weights_bytes)}, KV {_gib(device.kv_bytes)}, compute "
            f"{_gib(device.compute_bytes)}, overhead {_gib(device.overhead_bytes)}"
            + (
                f", vision projector {_gib(device.projector_bytes)}"
                if device.projector_bytes
                else ""
            )
            + (
                f", draft {memory.draft.model.name} {_gib(device.draft_bytes)}."
                if memory.draft is not None
                else "."
            )
        )

    def what_would_fit(self, memory: MemoryModel, pair: KvPair) -> str:
        base = self.base(memory, pair, 1, self.ubatches()[-1])
        ctx = self.max_ctx(memory, base, self.trained_ctx(memory))
        if ctx:
            return (
                f"What fits: {memory.model.file_type} with {kv_label(pair)} KV holds {ctx} "
                "tokens in one slot."
            )
        relaxed = replace(self.request, quant=None, kv=None, ctx=None, parallel=None)
        if relaxed != self.request and len(self.models) > 0:
            try:
                result = Search(self.models, self.hardware, relaxed).run()
            except PlanError:
                pass
            else:
                s = result.choice.settings
                return (
                    f"What fits without the fixed knobs: {s.quant} with {s.type_k}/{s.type_v} KV, "
                    f"{s.n_parallel} slot(s) × {s.n_ctx_per_slot} tokens."
                )
        return "Even the smallest context does not fit: use a smaller model or more memory."


HIGH_PRECISION_TYPES = {"F32", "F16", "BF16", "Q8_0"}


def _quantize_hint(model: ModelInfo) -> str:
    """Offer local quantization when the only file is a high-precision one."""
    local = not model.source.startswith(("catalogue:", "hf://", "http"))
    if model.file_type.upper() not in HIGH_PRECISION_TYPES or not local:
        return ""
    return f" Or make a smaller file of it locally: homelab quantize {model.source} --to Q4_K_M"


def _largest(low: int, high: int, ok: Callable[[int], bool], empty: int = 0) -> int:
    """The largest n in [low, high] with ok(n), assuming ok is monotone (true, then false)."""
    if high < low or not ok(low):
        return empty
    while low < high:
        middle = (low + high + 1) // 2
        if ok(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _smallest(low: int, high: int, ok: Callable[[int], bool]) -> int:
    """The smallest n in [low, high] with ok(n) (ok monotone: false, then true); 0 if none."""
    if high < low or not ok(high):
        return 0
    while low < high:
        middle = (low + high) // 2
        if ok(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _gib(n_bytes: int) -> str:
    return format_gib(n_bytes)
