"""A bare llama-cpp-python decode loop (no homelab): the floor of any Python engine over the
same library, for ``step_bench``'s single-stream row.

    python -m benchmarks.bare_loop MODEL THREADS CTX    # answers step_bench's JSON commands

One context, one sequence: set the batch's one token, ``llama_decode``, pick the next token with
llama.cpp's greedy sampler (what a plain Python loop does), as many tokens as asked. Between
homelab (its scheduler, events, detokenizing, metrics) and llama-bench (C++, and no sampling:
its next token is random) this separates what homelab adds from what calling llama.cpp from
Python costs at all. It speaks ``step_bench``'s protocol: a ``{"ready": true}`` line, then for
each ``{"op": "stream", "tokens": N}`` line one ``{"value": tok/s, "between_us": µs}`` line.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from typing import Any

from benchmarks.decode_gaps import between_decodes_us, time_decodes


def serve(model: str, threads: int, ctx: int) -> None:
    import llama_cpp

    llama_cpp.llama_backend_init()
    silence = llama_cpp.llama_log_callback(lambda *_: None)
    llama_cpp.llama_log_set(silence, ctypes.c_void_p())
    defaults = llama_cpp.llama_model_default_params()
    loaded = llama_cpp.llama_model_load_from_file(model.encode(), defaults)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = ctx, 2048, 512, 1
    params.flash_attn_type, params.no_perf = 0, True
    params.n_threads = params.n_threads_batch = threads
    context = llama_cpp.llama_init_from_model(loaded, params)
    greedy = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(greedy, llama_cpp.llama_sampler_init_greedy())
    batch = llama_cpp.llama_batch_init(1, 0, 1)
    batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = 1, 0, 1
    decodes = time_decodes()
    generate(llama_cpp, context, greedy, batch, 16)  # warm: graphs built
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        decodes.clear()
        tok_s = generate(llama_cpp, context, greedy, batch, command["tokens"])
        print(json.dumps({"value": tok_s, "between_us": between_decodes_us(decodes)}), flush=True)


def generate(llama_cpp: Any, context: Any, greedy: Any, batch: Any, n_tokens: int) -> float:
    """Decode ``n_tokens`` tokens from an empty cache; tok/s."""
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(context), True)
    token, started = 1, time.perf_counter()
    batch.n_tokens = 1
    for position in range(n_tokens):
        batch.token[0], batch.pos[0] = token, position
        llama_cpp.llama_decode(context, batch)
        token = llama_cpp.llama_sampler_sample(greedy, context, 0)
    return n_tokens / (time.perf_counter() - started)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
