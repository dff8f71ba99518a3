"""Plan, load and generate greedily in a process of its own, printing one JSON document.

    python tests/llamacpp/rpc/rpc_child.py MODEL_PATH PROMPT [ENDPOINT,ENDPOINT BUDGET_BYTES
                                                              [SPLIT_MODE MAIN_GPU]]

Registering RPC workers is process-wide in ggml (and llama.cpp aborts the process when a
worker dies), so the RPC tests never load through workers inside the pytest process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from homelab.engine.api import FinishEvent, GenerationRequest, SamplingParams
    from homelab.models.launch import open_engine
    from homelab.models.ref import resolve
    from homelab.planner.budget import resolve_hardware, with_workers
    from homelab.planner.search import PlanRequest

    path, prompt = sys.argv[1], sys.argv[2]
    endpoints = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ()
    budget = int(sys.argv[4]) if len(sys.argv) > 4 else None
    hardware = with_workers(resolve_hardware(), endpoints, budget)
    split_mode = sys.argv[5] if len(sys.argv) > 5 else "layer"
    main_gpu = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    # flash attention fixed: the planner's own choice differs with every layer on the CPU
    # (off) and on devices (on), and the local text is compared with the split one
    request = PlanRequest(
        ctx=256, parallel=1, split_mode=split_mode, main_gpu=main_gpu, flash_attn=True
    )
    engine, plan = open_engine(resolve(str(Path(path))), request, hardware)
    try:
        sampling = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        pieces = []
        for event in engine.submit(GenerationRequest("test", prompt, sampling)):
            if isinstance(event, FinishEvent):
                break
            pieces.append(event.text)
        buffers = engine.load_report.buffers
        document = {
            "text": "".join(pieces),
            "settings": plan.settings.to_dict(),
            "planned": [d.to_dict() for d in plan.memory.devices],
            "buffers": {"model": buffers.model, "kv": buffers.kv, "compute": buffers.compute},
            "verified": plan.verified.to_dict(),
        }
    finally:
        engine.close()
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
