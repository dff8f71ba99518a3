"""``homelab quality MODEL``: what the plan's K/V cache (and weights) cost in quality.

The plan (as ``homelab plan`` would choose it for this weights file) and the same weights with
each K/V type are compared with a reference — the most precise weights file of the model
found next to it, with an f16 cache — on a text: KL divergence of the next-token
distributions (mean, p99, max), top-1 agreement and perplexity. The result is saved for the
dashboard, which shows it next to the plan.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from homelab.bench.quality import QualityResult

DEFAULT_KV_TYPES = "f16,q8_0,q4_0"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a GGUF file, or demo / demo:bench")
    parser.add_argument(
        "--text", metavar="FILE", help="UTF-8 text to read (default: a bundled essay)"
    )
    parser.add_argument("--ctx", type=int, default=512, help="tokens per chunk (512)")
    parser.add_argument("--chunks", type=int, metavar="N", help="read at most N chunks")
    parser.add_argument(
        "--kv-types", default=DEFAULT_KV_TYPES, help=f"K/V types to compare ({DEFAULT_KV_TYPES})"
    )
    parser.add_argument(
        "--reference",
        metavar="FILE",
        help="reference weights (default: the most precise file beside MODEL)",
    )
    parser.add_argument("--budget", metavar="BYTES", help="plan with this much memory (e.g. 2GiB)")
    parser.add_argument("--no-save", action="store_true", help="do not keep the result")


def run(args: argparse.Namespace) -> int:
    from homelab.lock import refuse_if_server_running

    refuse_if_server_running("quality run")
    result, saved = _measure(args)
    if args.json:
        document = result.to_dict() | {"saved_to": saved}
        print(json.dumps(document, indent=2))
        return 0
    from homelab.bench.render import print_all, quality_report

    print_all(quality_report(result, saved))
    return 0


def _measure(args: argparse.Namespace) -> tuple[QualityResult, str | None]:
    from dataclasses import replace

    from homelab.bench import planning, quality, render, store, weights
    from homelab.errors import BenchError
    from homelab.gguf.reader import read_model

    path = planning.resolve_model_path(args.model)
    info = read_model(path)
    hardware = planning.bench_hardware(planning.parse_budget(args.budget))
    settings = planning.planned(info, hardware).settings
    reference = (
        weights.describe(planning.resolve_model_path(args.reference))
        if args.reference
        else weights.most_precise(path)
    )
    kv_types = [kv.strip() for kv in args.kv_types.split(",") if kv.strip()]
    comparison = quality.plan_comparison(
        str(path.resolve()),
        settings.quant,
        settings.type_k,
        settings.type_v,
        settings.flash_attn,
        reference_path=str(reference.path),
        reference_quant=reference.quant,
        kv_types=kv_types,
    )
    if args.ctx < 16:
        raise BenchError(f"--ctx {args.ctx} is too small", hint="Use at least 16 (512 is usual).")
    text, source = quality.read_text(args.text)
    with render.progress_bar(None, "quality") as ticker:
        result = quality.measure_quality(
            comparison.reference,
            comparison.candidates,
            text,
            model_name=info.name,
            text_source=source,
            plan_key=comparison.plan_key,
            n_ctx=args.ctx,
            max_chunks=args.chunks,
            progress=ticker.set,
        )
    result = replace(
        result,
        measured_at=store.now_iso(),
        hardware_id=planning.profile_hardware_id(hardware),
        notes=comparison.notes,
    )
    saved = None if args.no_save else str(store.save_quality(result))
    return result, saved
