"""Turn the GPU check's ``results.json`` into the markdown section for benchmarks/RESULTS.md.

    python -m benchmarks.gpu.report /work/.device/.../results.json > /tmp/h200.md

Prints what was measured, marks what failed or was skipped, and never invents a figure: a
cell whose measurement is missing shows "—".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MIB = 1 << 20
DASH = "—"


def mib(n_bytes: float | None) -> str:
    return DASH if n_bytes is None else f"{n_bytes / MIB:,.1f}"


def pct(value: float | None) -> str:
    return DASH if value is None else f"{value:+.1f} %"


def rate(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f}"


def ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator:
        return DASH
    return f"{numerator / denominator:.2f}×"


def table(header: list[str], rows: Iterable[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# --- header ----------------------------------------------------------------------------------


def header(data: dict[str, Any]) -> list[str]:
    meta, build = data.get("meta", {}), data.get("build") or {}
    gpus = [d for d in (data.get("hardware") or {}).get("devices", []) if d["kind"] == "gpu"]
    gpu = gpus[0]["label"] if gpus else "no GPU seen by NVML"
    lines = [
        f"## H200: planner truth, engine speed and the concurrency table on CUDA ({gpu})",
        "",
        f"Measured by `benchmarks/gpu/run_on_gpu.sh` ({meta.get('mode', '?')} mode), "
        f"{meta.get('started', '?')} – {meta.get('finished', 'did not finish')}. "
        f"llama-cpp-python {build.get('version', '?')} (llama.cpp "
        f"{(meta.get('llama_cpp_commit') or '?')[:9]}) built there with "
        f"`{(meta.get('environment') or {}).get('CMAKE_ARGS', '?')}`; "
        f"backends: {', '.join(build.get('backends') or []) or '?'}.",
        "",
    ]
    for name, model in (data.get("models") or {}).items():
        lines.append(
            f"- `{name}`: {model['file']} — {model['n_params'] / 1e6:,.0f} M parameters, "
            f"{model['file_type']}, {model['file_bytes'] / MIB:,.0f} MiB, {model['n_layer']} "
            f"layers, n_embd {model['n_embd']}, {model['n_head']}/{model['n_head_kv']} heads, "
            f"trained context {model['context_length']}, **random weights**"
        )
    return [*lines, ""]


# --- memory ----------------------------------------------------------------------------------


def _cell(rows: list[dict[str, Any]], component: str, note_prefix: str = "") -> str:
    found = [r for r in rows if r["component"] == component and r["note"].startswith(note_prefix)]
    if not found:
        return DASH
    row = max(found, key=lambda r: r["actual_bytes"] or 0)  # the peak stage
    return f"{mib(row['predicted_bytes'])} / {mib(row['actual_bytes'])} ({pct(row['error_pct'])})"


def memory(data: dict[str, Any]) -> list[str]:
    cases = data.get("memory") or []
    if not cases:
        return ["### Planner vs real memory", "", "Not measured (see the errors below).", ""]
    rows = []
    for case in cases:
        settings = case["settings"]
        knobs = (
            f"{settings['n_parallel']}×{settings['n_ctx_per_slot']}, "
            f"{settings['type_k']}/{settings['type_v']}, ngl {settings['n_gpu_layers']}"
        )
        by_device: dict[str, list[dict[str, Any]]] = {}
        for row in case["components"]:
            by_device.setdefault(row["device"], []).append(row)
        for device, device_rows in by_device.items():
            rows.append(
                [
                    case["case"]["label"],
                    knobs,
                    device,
                    _cell(device_rows, "weights"),
                    _cell(device_rows, "kv"),
                    _cell(device_rows, "compute"),
                    _cell(device_rows, "overhead", "NVML after load")
                    if device != "CPU"
                    else _cell(device_rows, "overhead"),
                    _cell(device_rows, "overhead", "NVML after") if device != "CPU" else DASH,
                    _cell(device_rows, "total") if device != "CPU" else DASH,
                ]
            )
    head = ["plan", "slots×ctx, K/V, ngl", "device", "weights", "KV", "compute"]
    head += ["overhead after load", "overhead peak", "total vs NVML peak"]
    return [
        "### Planner vs real memory (MiB: predicted / actual (error))",
        "",
        "Actual weights, KV and compute are llama.cpp's logged buffers; GPU overhead is NVML's "
        "per-process VRAM minus those buffers (after load, and the peak over a first decode, a "
        "prompt filling the slot and all slots decoding); the CPU's overhead is the logits "
        "(output) buffer.",
        "",
        *table(head, rows, right_from=3),
        "",
    ]


# --- speed -----------------------------------------------------------------------------------


def _bench_ts(records: list[dict[str, Any]], n_prompt: int, n_gen: int, **match: Any) -> Any:
    wanted = {"n_prompt": n_prompt, "n_gen": n_gen, **match}
    for record in records:
        if all(record.get(key) == value for key, value in wanted.items()):
            return record.get("avg_ts")
    return None


def _median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def speed(data: dict[str, Any]) -> list[str]:
    found = data.get("speed") or {}
    config = (data.get("meta") or {}).get("config", {})
    pp, tg = config.get("pp_tokens", 512), config.get("tg_tokens", 128)
    tool = (found.get("llama_bench") or {}).get("records", [])
    batched = (found.get("batched_bench") or {}).get("records", [])
    engine = found.get("engine") or {}
    single = engine.get("single") or {}
    engine_pp = (single.get("prefill_tok_s") or {}).get("median")
    engine_tg = (single.get("decode_tok_s") or {}).get("median")
    tool_pp, tool_tg = _bench_ts(tool, pp, 0), _bench_ts(tool, 0, tg)
    between = engine.get("between_us") or {}
    rows = [
        [f"pp{pp}, one stream", rate(tool_pp), rate(engine_pp), ratio(engine_pp, tool_pp), ""],
        [f"tg{tg}, one stream", rate(tool_tg), rate(engine_tg), ratio(engine_tg, tool_tg),
         _own_share(between.get("1"), engine_tg, 1)],
    ]  # fmt: skip
    aggregate = engine.get("aggregate_tok_s") or {}
    for streams in config.get("speed_streams", []):
        tool_rate = next((r["speed_tg"] for r in batched if r.get("pl") == streams), None)
        ours = _median(aggregate.get(str(streams)))
        rows.append(
            [f"{streams} streams, aggregate decode", rate(tool_rate), rate(ours),
             ratio(ours, tool_rate), _own_share(between.get(str(streams)), ours, streams)]
        )  # fmt: skip
    commands = [c["command"] for c in (found.get("llama_bench"), found.get("batched_bench")) if c]
    header = ["measurement", "llama.cpp tool", "homelab engine", "engine / tool"]
    return [
        "### Engine vs llama.cpp's tools (bench model Q8_0, f16 K/V, flash attention, tok/s)",
        "",
        *table([*header, "homelab's own µs per step (share)"], rows),
        "",
        "Engine figures: medians of its per-request clocks (pp/tg) and of the repetitions "
        "(aggregate); its own time per step is the median gap between two `llama_decode` "
        "calls (benchmarks/decode_gaps.py). Tools: " + "; ".join(f"`{c}`" for c in commands),
        "",
    ]


def _own_share(between_us: float | None, tok_s: float | None, streams: int) -> str:
    """homelab's µs between decodes, and its share of a step at ``tok_s`` over ``streams``."""
    if between_us is None or math.isnan(between_us) or not tok_s:
        return "—"
    step_us = 1e6 * streams / tok_s
    return f"{between_us:.0f} ({between_us / step_us:.1%})"


def kv_speed(data: dict[str, Any]) -> list[str]:
    found = data.get("kv_speed") or {}
    config = (data.get("meta") or {}).get("config", {})
    pp, tg, depth = config.get("pp_tokens", 512), config.get("tg_tokens", 128), config["kv_depth"]
    records = [r for run in found.get("llama_bench", []) for r in run["records"]]
    engines = {(e["type_k"], e["type_v"]): e for e in found.get("engine", [])}
    pairs = {(r["type_k"], r["type_v"]) for r in records} | set(engines)
    rows = []
    for pair in sorted(pairs):
        kv = {"type_k": pair[0], "type_v": pair[1]}
        engine = engines.get(pair, {})
        speed_ = engine.get("speed") or {}
        rows.append(
            [
                f"{pair[0]}/{pair[1]}",
                rate(_bench_ts(records, pp, 0, n_depth=0, **kv)),
                rate(_bench_ts(records, 0, tg, n_depth=0, **kv)),
                rate(_bench_ts(records, pp, 0, n_depth=depth, **kv)),
                rate(_bench_ts(records, 0, tg, n_depth=depth, **kv)),
                rate((speed_.get("prefill_tok_s") or {}).get("median")),
                rate((speed_.get("decode_tok_s") or {}).get("median")),
                rate(_median(engine.get("deep_prefill_tok_s"))),
                rate(_median(engine.get("deep_decode_tok_s"))),
            ]
        )
    head = ["K/V", f"bench pp{pp}", f"bench tg{tg}", f"bench pp{pp} @{depth}"]
    head += [f"bench tg{tg} @{depth}", f"engine pp{pp}", f"engine tg{tg}"]
    head += [f"engine prefill {depth}", f"engine tg{tg} after {depth}"]
    commands = [run["command"] for run in found.get("llama_bench", [])]
    return [
        "### K/V cache type speed (big model Q8_0, one stream, flash attention, tok/s)",
        "",
        *table(head, rows),
        "",
        "llama-bench: " + "; ".join(f"`{c}`" for c in commands),
        "",
    ]


def concurrency(data: dict[str, Any]) -> list[str]:
    found = data.get("table")
    if not found:
        return ["### Concurrency × K/V type", "", "Not measured (see the errors below).", ""]
    rows = []
    for cell in found["cells"]:
        measured = cell.get("aggregate_decode_tok_s") is not None
        rows.append(
            [
                cell["kv_type"],
                str(cell["concurrency"]),
                mib(cell.get("predicted_bytes")),
                rate(cell.get("aggregate_decode_tok_s")) if measured else "does not fit",
                rate(cell.get("mean_stream_decode_tok_s")) if measured else "",
                f"{cell['ttft_p50_s'] * 1000:.0f} ms" if measured else "",
                f"{cell['ttft_p95_s'] * 1000:.0f} ms" if measured else "",
            ]
        )
    head = ["K/V", "requests", "memory (planned, MiB)", "aggregate tok/s", "per stream tok/s"]
    head += ["TTFT p50", "TTFT p95"]
    return [
        f"### Concurrency × K/V type under a {mib(found['budget_bytes'])} MiB budget "
        f"(big model, {found['n_ctx_per_request']} tokens per request, "
        f"{found['prompt_tokens']}-token prompts, {found['generated_tokens']} generated)",
        "",
        *table(head, rows),
        "",
    ]


def problems(data: dict[str, Any]) -> list[str]:
    lines = []
    for error in data.get("errors", []):
        first = error["error"].strip().splitlines()[0] if error["error"].strip() else "?"
        lines.append(f"- failed: {error['where']}: {first}")
    for skipped in data.get("skipped", []):
        lines.append(f"- skipped: {skipped['where']}: {skipped['why']}")
    return ["### What failed or was skipped", "", *(lines or ["Nothing."]), ""]


def serving(data: dict[str, Any]) -> list[str]:
    """The serving benchmarks' own markdown tables, each under its command."""
    found = data.get("serving") or {}
    lines: list[str] = []
    titles = (
        ("server_bench", "homelab serve vs llama-server"),
        ("ttft", "TTFT"),
        ("sampling", "greedy picks: sampler per sequence vs one argmax"),
        ("sampled", "sampled picks: the whole vocabulary vs its top-k first"),
        ("images", "image encode and TTFT, generated vision pairs"),
    )
    for name, title in titles:
        bench = found.get(name)
        if bench:
            lines += [
                f"### {title} (big model, all layers on the GPU)",
                "",
                f"`{bench['command']}`",
            ]
            lines += ["", bench["table"].strip(), ""]
    return lines


def render(data: dict[str, Any]) -> str:
    parts = [header(data), memory(data), speed(data)]
    parts += [kv_speed(data), concurrency(data), serving(data), problems(data)]
    return "\n".join(line for part in parts for line in part)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="results.json from the device run")
    args = parser.parse_args(argv)
    print(render(json.loads(args.results.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
