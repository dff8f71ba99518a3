"""``homelab plan MODEL``: choose quant, KV types, context, slots and offload for a model.

Every MODEL form plans: a local file (with its sibling quants, confirmed by a llama.cpp dry
run), a demo model, a hub repo (remote headers, before any download), a catalogue name
(``homelab plan llama-3.1-8b --gpu rtx-4090`` works offline). Without ``--gpu`` / ``--vram``
the plan is for this machine as detected.
"""

from __future__ import annotations

import argparse
import json

from homelab.cli import flags, prompt_cache


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(parser)
    flags.add_target_hardware(parser)
    parser.add_argument("--no-verify", action="store_true", help="skip the llama.cpp dry run")
    flags.add_plan_flags(parser)
    flags.add_draft_flag(parser)
    prompt_cache.add_flags(parser, serving=False)  # to see the plan serve would make


def run(args: argparse.Namespace) -> int:
    from homelab.models.mmproj import with_projector
    from homelab.planner.plan import plan_model
    from homelab.planner.render import render_plan

    hardware, _ = prompt_cache.reserve(args, flags.hardware(args), serving=False)
    request = flags.plan_request(args)  # with --draft's header
    variants = flags.model_ref(args.model).variants()
    request = with_projector(request, variants[0])  # --mmproj, or the one beside the file
    candidates = flags.draft_candidates() if request.draft is None else []
    plan = plan_model(
        variants, hardware, request, verify=not args.no_verify, draft_candidates=candidates
    )
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(render_plan(plan), end="")
    return 0 if plan.fits else 1
