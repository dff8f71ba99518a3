"""Speculative decoding: decode tok/s with and without it, and against llama.cpp's own.

    python -m benchmarks.spec_bench [--rounds 5] [--quant Q8_0] [--max-wait 120] [--cold]

Target and draft are the generated pair ``demo:spec`` / ``demo:spec-draft`` (the draft is
the target's own first two layers and head, so greedy agreement is high by construction).
Two tasks:

- ``repeat``: the prompt is a passage given twice and the request asks for it again — the
  text-repeating work where prompt lookup shines (with random weights the model does not
  obey, but its own output loops, which prompt lookup also catches);
- ``fresh``: a short prompt, nothing to copy from but what the model writes itself.

Steady state (the default, like ``server_bench``): per stream count, one engine per contender
is loaded and warmed with one unmeasured round (the adaptive policy has measured its costs),
then the rounds run back to back against those same engines, interleaving the contenders
round by round (every other round in reverse order); the table gives each contender's
median and worst round, and its ratio to the plain row both of the medians and round by
round (median and worst of the per-round ratios). ``--cold`` keeps
the old way: a fresh process per measurement (cold-start medians). Each measurement waits for
the CPUs to be mostly idle. Single stream: 128 tokens,
decode tok/s from the first token to the last. Eight streams: eight requests at once, eight
slots, aggregate decode tok/s once all have their first token. llama.cpp's
``llama-speculative-simple`` (built from the same vendored tree, see ``llama_tools``) runs
the same pair and the same ngram idea (``--spec-type ngram-simple``) for comparison, next to
``llama-bench`` tg128 as its no-speculation baseline.

Each stream count also has an A/A control: a second plain engine measured like a contender.
Its ratio to the plain row is what the machine's noise alone does to a ratio — the floor
under which a contender's loss or gain is not resolved by this run.

This is a harness, not a test: nothing here asserts; the ratios are printed and saved.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.engine_bench import Series, wait_for_quiet
from benchmarks.llama_tools import BUILD_DIR, HERE, tool_path
from homelab.engine.api import FinishEvent, GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.engine.speculation.config import SpeculationConfig
from homelab.settings import Settings

N_GEN = 128
CTX_PER_SLOT = 1024
SPEC_TOOL = "llama-speculative-simple"
PASSAGE = (
    "The memory of a homelab is mostly its cache: the weights are read once per token, "
    "the keys and values of every earlier token are read again and again, and whatever "
    "does not fit on the card is streamed over the bus at a tenth of the speed."
)
PROMPTS = {
    "repeat": f"Repeat this text exactly.\n\n{PASSAGE}\n\n{PASSAGE}\n\nAgain:\n",
    "fresh": "The memory of a homelab",
}
GREEDY = {"temperature": 0.0}
SAMPLED = {"temperature": 0.8, "seed": 1234}


@dataclass(frozen=True)
class Case:
    """One engine configuration on one task."""

    label: str
    task: str
    streams: int
    kind: str | None = None  # None: no speculation
    adaptive: bool = True
    max_draft: int = 8
    sampling: dict[str, Any] = field(default_factory=lambda: dict(GREEDY))


CONTROL = "plain again (A/A control)"  # a second plain engine: what noise alone does to a ratio
CASES = (
    Case("plain", "fresh", 1),
    Case("ngram adaptive", "fresh", 1, "ngram"),
    Case("draft adaptive", "fresh", 1, "draft"),
    Case("draft fixed k=4", "fresh", 1, "draft", adaptive=False, max_draft=4),
    Case(CONTROL, "fresh", 1),  # mid-group: as far in time from plain as a contender is
    Case("plain", "repeat", 1),
    Case("ngram adaptive", "repeat", 1, "ngram"),
    Case("ngram fixed k=8", "repeat", 1, "ngram", adaptive=False),
    Case("plain, T=0.8", "fresh", 1, sampling=dict(SAMPLED)),
    Case("ngram adaptive, T=0.8", "fresh", 1, "ngram", sampling=dict(SAMPLED)),
    Case("draft adaptive, T=0.8", "fresh", 1, "draft", sampling=dict(SAMPLED)),
    Case("plain", "fresh", 8),
    Case("ngram adaptive", "fresh", 8, "ngram"),
    Case(CONTROL, "fresh", 8),
    Case("draft adaptive", "fresh", 8, "draft"),
    Case("plain", "repeat", 8),
    Case("ngram adaptive", "repeat", 8, "ngram"),
)


@dataclass(frozen=True)
class Models:
    target: Path
    draft: Path
    threads: int = 2

    @classmethod
    def demo(cls, quant: str, threads: int) -> Models:
        from homelab.gguf.demo import demo_model_path

        target = demo_model_path("spec", "bench", quant)
        return cls(target, demo_model_path("spec-draft", "bench", quant), threads)


# --- the engine (one measurement per process) -------------------------------------------------


def _engine(models: Models, case: Case) -> Engine:
    settings = Settings(
        n_ctx=CTX_PER_SLOT * case.streams,
        n_ctx_per_slot=CTX_PER_SLOT,
        n_parallel=case.streams,
        n_threads=models.threads,
    )
    speculation = None
    if case.kind is not None:
        draft = models.draft if case.kind == "draft" else None
        speculation = SpeculationConfig(
            case.kind,  # type: ignore[arg-type]
            draft_path=draft,
            adaptive=case.adaptive,
            max_draft_tokens=case.max_draft,
        )
    return Engine.load(models.target, settings, record_calibration=False, speculation=speculation)


def engine_case(models: Models, case: Case) -> dict[str, float | None]:
    """Decode tok/s (one stream, or the aggregate of all) and what speculation did."""
    with _engine(models, case) as engine:
        engine.submit(GenerationRequest("warm-up", "hello", SamplingParams(max_tokens=4))).collect()
        return engine_round(engine, case, 0)


def engine_round(engine: Engine, case: Case, round_index: int) -> dict[str, float | None]:
    """One round of ``case`` against a loaded engine; each round's prompts are new (no
    prefix-cache hit from an earlier round)."""
    sampling = SamplingParams(max_tokens=N_GEN, ignore_eos=True, **case.sampling)
    prompt = PROMPTS[case.task]
    before = engine.metrics()
    started = time.perf_counter()
    handles = [
        engine.submit(
            GenerationRequest(f"r{round_index}t{i}", f"[{round_index}.{i}] {prompt}", sampling)
        )
        for i in range(case.streams)  # distinct prompts: no shared prefix
    ]
    finishes = [handle.collect().finish for handle in handles]
    ended = time.perf_counter()
    after = engine.metrics()
    drafted = after.draft_tokens_total - before.draft_tokens_total
    accepted = after.accepted_draft_tokens_total - before.accepted_draft_tokens_total
    decoded = after.decode_tokens_total - before.decode_tokens_total
    return {
        "tok_s": _decode_rate(finishes, started, ended),
        "acceptance": accepted / drafted if drafted else None,
        # each sequence step emits one token plus the drafts it kept
        "tokens_per_step": decoded / (decoded - accepted) if decoded > accepted else None,
        "drafted": float(drafted),
    }


def _decode_rate(finishes: list[FinishEvent], started: float, ended: float) -> float:
    if len(finishes) == 1:
        return finishes[0].stats.decode_tok_s  # first token to last
    first_tokens = max(started + finish.stats.ttft_s for finish in finishes)
    decoded = sum(finish.stats.completion_tokens - 1 for finish in finishes)
    return decoded / (ended - first_tokens)


def isolated(models: Models, case: Case) -> dict[str, float | None]:
    payload = {"models": {k: str(v) for k, v in asdict(models).items()}, "case": asdict(case)}
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.spec_bench", "--worker", json.dumps(payload)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {case}:\n{result.stderr[-2000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def _worker_main(payload_text: str) -> None:
    payload = json.loads(payload_text)
    raw = payload["models"]
    models = Models(Path(raw["target"]), Path(raw["draft"]), int(raw["threads"]))
    print(json.dumps(engine_case(models, Case(**payload["case"]))))


# --- llama.cpp's tools -------------------------------------------------------------------------

_SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def build_spec_tool() -> Path:
    """``llama-speculative-simple`` in the comparison tools' build tree (seconds once the
    other tools are built: it only links llama.cpp's common library)."""
    path = tool_path(SPEC_TOOL)
    if not path.is_file():
        if not (BUILD_DIR / "build.ninja").is_file() and not (BUILD_DIR / "Makefile").is_file():
            from benchmarks.llama_tools import build_tools

            build_tools()
        subprocess.run(
            ["cmake", "--build", str(BUILD_DIR), "--target", SPEC_TOOL, "-j", "2"], check=True
        )
    return path


def llama_speculative(models: Models, task: str, spec_type: str) -> dict[str, float | None]:
    command = [
        str(build_spec_tool()), "-m", str(models.target), "-p", PROMPTS[task],
        "-n", str(N_GEN), "-t", str(models.threads), "-c", str(CTX_PER_SLOT),
        "--temp", "0", "--ignore-eos", "--spec-type", spec_type, "--spec-draft-n-max", "8",
    ]  # fmt: skip
    if spec_type == "draft-simple":
        command += ["-md", str(models.draft)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, errors="replace")
    log = result.stdout + result.stderr
    if result.returncode != 0:
        raise RuntimeError(f"{SPEC_TOOL} exited with {result.returncode}:\n{log[-2000:]}")
    speed, accept = _SPEED.search(log), _ACCEPT.search(log)
    if speed is None:
        raise RuntimeError(f"{SPEC_TOOL} printed no speed:\n{log[-2000:]}")
    return {
        "tok_s": float(speed[3]),
        "acceptance": float(accept[1]) / 100 if accept else None,
        "tokens_per_step": None,
        "drafted": None,
    }


def llama_bench(models: Models) -> dict[str, float | None]:
    command = [
        str(tool_path("llama-bench")), "-m", str(models.target), "-p", "0", "-n", str(N_GEN),
        "-t", str(models.threads), "-r", "1", "-o", "json",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    speed = float(json.loads(result.stdout)[0]["avg_ts"])
    return {"tok_s": speed, "acceptance": None, "tokens_per_step": None, "drafted": None}


# --- the run ---------------------------------------------------------------------------------

Result = dict[str, float | None]
Measurement = tuple[str, Callable[[], Result]]


def plan(models: Models, with_llama: bool) -> list[Measurement]:
    cases: list[Measurement] = [
        (f"{case.streams} stream(s) · {case.task} · {case.label}", _bind(models, case))
        for case in CASES
    ]
    if with_llama:
        cases += [
            ("llama-bench tg128 (no speculation)", lambda: llama_bench(models)),
            ("llama-speculative-simple · fresh · draft, n_max 8",
             lambda: llama_speculative(models, "fresh", "draft-simple")),
            ("llama-speculative-simple · repeat · ngram-simple, n_max 8",
             lambda: llama_speculative(models, "repeat", "ngram-simple")),
        ]  # fmt: skip
    return cases


def _bind(models: Models, case: Case) -> Callable[[], Result]:
    return lambda: isolated(models, case)


def measure(
    models: Models,
    rounds: int,
    min_idle: float,
    max_wait_s: float,
    with_llama: bool,
    only: tuple[str, ...] = (),
) -> dict[str, dict[str, Series]]:
    series: dict[str, dict[str, Series]] = {}
    chosen = [(n, t) for n, t in plan(models, with_llama) if not only or any(o in n for o in only)]
    for round_index in range(rounds):
        print(f"round {round_index + 1}/{rounds}", flush=True)
        for name, take in chosen:
            idle = wait_for_quiet(min_idle, max_wait_s, print)
            try:
                result = take()
            except (RuntimeError, subprocess.SubprocessError) as failure:  # one bad run: skip it
                print(f"  {name:<62} failed: {str(failure).splitlines()[0]}", flush=True)
                continue
            for key, value in result.items():
                if value is not None:
                    series.setdefault(name, {}).setdefault(key, Series(key, "")).values.append(
                        value
                    )
            print(f"  {name:<62} {result['tok_s']:8.1f} tok/s  acceptance "
                  f"{_pct(result['acceptance'])}  (CPUs {idle:.0%} idle)", flush=True)  # fmt: skip
    return series


def measure_steady(
    models: Models,
    rounds: int,
    min_idle: float,
    max_wait_s: float,
    with_llama: bool,
    only: tuple[str, ...] = (),
) -> dict[str, dict[str, Series]]:
    """Per stream count: load every contender once, warm it, then interleave the rounds."""
    series: dict[str, dict[str, Series]] = {}
    chosen = [(_name(case), case) for case in CASES]
    chosen = [(n, c) for n, c in chosen if not only or any(o in n for o in only)]
    for streams in sorted({case.streams for _, case in chosen}):
        group = [(n, c) for n, c in chosen if c.streams == streams]
        engines = [_engine(models, case) for _, case in group]
        try:
            for engine, (_, case) in zip(engines, group, strict=True):
                engine_round(engine, case, -1)  # warm-up: unmeasured
            for round_index in range(rounds):
                print(f"{streams} stream(s): round {round_index + 1}/{rounds}", flush=True)
                contenders = list(zip(engines, group, strict=True))
                if round_index % 2:  # every other round backwards: a drift of the machine
                    contenders.reverse()  # over a round favours no contender
                for engine, (name, case) in contenders:
                    idle = wait_for_quiet(min_idle, max_wait_s, print)
                    _record(series, name, engine_round(engine, case, round_index), idle)
        finally:
            for engine in engines:
                engine.close()
    if with_llama:
        tools = [(n, t) for n, t in plan(models, True) if not n[0].isdigit()]
        for _ in range(rounds):
            for name, take in tools:
                idle = wait_for_quiet(min_idle, max_wait_s, print)
                try:
                    _record(series, name, take(), idle)
                except (RuntimeError, subprocess.SubprocessError) as failure:
                    print(f"  {name:<62} failed: {str(failure).splitlines()[0]}", flush=True)
    return series


def _name(case: Case) -> str:
    return f"{case.streams} stream(s) · {case.task} · {case.label}"


def _record(series: dict[str, dict[str, Series]], name: str, result: Result, idle: float) -> None:
    for key, value in result.items():
        if value is not None:
            series.setdefault(name, {}).setdefault(key, Series(key, "")).values.append(value)
    print(f"  {name:<62} {result['tok_s']:8.1f} tok/s  acceptance "
          f"{_pct(result['acceptance'])}  (CPUs {idle:.0%} idle)", flush=True)  # fmt: skip


def _pct(value: float | None) -> str:
    return "  —  " if value is None else f"{value:5.0%}"


def table(series: dict[str, dict[str, Series]]) -> str:
    """Medians and worst rounds, and each contender against the plain row twice: the ratio
    of the medians, and the ratio round by round (the two ran minutes apart at most, seconds
    apart within a round: a machine that slows for a while moves both) — its median and worst.
    """
    lines = [
        "| measurement | tok/s median | tok/s worst | vs plain (medians) | vs plain per round: "
        "median · worst | acceptance | tokens/step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, values in series.items():
        tok_s = values["tok_s"]
        base = _baseline(series, name)
        ratio = f"{tok_s.median / base.median:.2f}×" if base else ""
        paired = _paired(tok_s, base) if base else []
        per_round = f"{statistics.median(paired):.2f}× · {min(paired):.2f}×" if paired else ""
        acceptance = values.get("acceptance")
        per_step = values.get("tokens_per_step")
        lines.append(
            f"| {name} | {tok_s.median:.1f} | {min(tok_s.values):.1f} | {ratio} | {per_round} | "
            f"{_pct(acceptance.median) if acceptance else '—'} | "
            f"{f'{per_step.median:.2f}' if per_step else '—'} |"
        )
    return "\n".join(lines)


def _paired(contender: Series, base: Series) -> list[float]:
    """Round-by-round ratios (none when a failed run left the two series unaligned)."""
    if len(contender.values) != len(base.values):
        return []
    return [c / b for c, b in zip(contender.values, base.values, strict=True)]


def _baseline(series: dict[str, dict[str, Series]], name: str) -> Series | None:
    """The tok/s of the matching no-speculation row (same streams, task, sampling)."""
    if name.startswith("llama-speculative"):
        base = series.get("llama-bench tg128 (no speculation)")
        return base["tok_s"] if base else None
    if " · " not in name:
        return None
    streams, task, label = name.split(" · ")
    plain = "plain, T=0.8" if "T=0.8" in label else "plain"
    base = series.get(f"{streams} · {task} · {plain}")
    return base["tok_s"] if base and label != plain else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--cold", action="store_true", help="a fresh process per measurement (cold start)"
    )
    parser.add_argument("--quant", default="Q8_0")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-idle", type=float, default=0.8)
    parser.add_argument("--max-wait", type=float, default=120.0)
    parser.add_argument("--no-llama", action="store_true", help="skip llama.cpp's tools")
    parser.add_argument("--only", default="", help="comma-separated parts of measurement names")
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(args.worker)
        return
    models = Models.demo(args.quant, args.threads)
    with open("/proc/loadavg") as load:
        print(f"target {models.target.name}, draft {models.draft.name}; load {load.read().strip()}")
    only = tuple(part for part in args.only.split(",") if part)
    run = measure if args.cold else measure_steady
    series = run(models, args.rounds, args.min_idle, args.max_wait, not args.no_llama, only)
    print(table(series))
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw = {name: {k: v.values for k, v in values.items()} for name, values in series.items()}
    (out / f"spec-{args.quant}-{stamp}.json").write_text(json.dumps(raw, indent=2))


if __name__ == "__main__":
    main()
