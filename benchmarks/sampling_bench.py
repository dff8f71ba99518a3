"""``python -m benchmarks.sampling_bench``: picking greedy tokens, per sequence or per batch.

    python -m benchmarks.sampling_bench                    # demo:bench (32,000 tokens), 1/8/32 rows
    python -m benchmarks.sampling_bench --model demo:llama:tiny:F16

llama.cpp's sampler chain copies the whole vocabulary into a candidate array for every
sequence it samples (``llama_sampler_sample``): linear in the vocabulary (32K for Llama 2,
128K for Llama 3, 152K for Qwen, 262K for Gemma 3), once per sequence per step, on the CPU —
while a GPU's step for an 8B model is ~6 ms. The engine picks the tokens of a step's plain
greedy sequences with one numpy argmax over the step's output rows instead
(``Scheduler._sample_greedy_batch``). This measures both on the logits of a real decode of
``--rows`` sequences: the sampler chain row by row against the one argmax, alternated over
``--rounds`` rounds of ``--repeat`` picks each; median and worst round. A harness, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from homelab.engine.api import SamplingParams
from homelab.engine.engine import Engine
from homelab.engine.sampling import SamplerChain
from homelab.gguf.demo import demo_ref_path
from homelab.llamacpp.batch import Batch
from homelab.settings import Settings


def measure(engine: Engine, rows: int, rounds: int, repeat: int) -> tuple[list[float], list[float]]:
    """(chain µs per step, argmax µs per step) per round, on the logits of one decode of one
    token in each of ``rows`` sequences (every token an output, as in a decode step)."""
    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    chain = SamplerChain(sampling, engine._vocab, engine.n_vocab, engine.eog_tokens)
    context = engine._loaded.context
    batch_rows = list(range(rows))

    def run() -> tuple[list[float], list[float]]:
        batch = Batch(rows)
        for row in batch_rows:
            batch.add(engine.bos_token_id or 1, 0, row, output=True)
        status = context.decode(batch)
        batch.close()
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status})")
        by_chain, by_argmax = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(repeat):
                for row in batch_rows:
                    chain.sample(context, row)
            by_chain.append(1e6 * (time.perf_counter() - started) / repeat)
            started = time.perf_counter()
            for _ in range(repeat):
                logits = context.output_logits(rows)
                assert logits is not None
                logits.argmax(axis=1).tolist()
            by_argmax.append(1e6 * (time.perf_counter() - started) / repeat)
        return by_chain, by_argmax

    try:
        return engine.run_on_engine_thread(run).result(600)
    finally:
        chain.close()
        engine.run_on_engine_thread(lambda: context.memory.clear()).result(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo:bench:Q8_0")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    row_counts = [int(r) for r in args.rows.split(",")]
    path = demo_ref_path(args.model) if args.model.startswith("demo:") else args.model
    most = max(row_counts)
    settings = Settings(n_ctx=64 * most, n_ctx_per_slot=64, n_parallel=most)
    engine = Engine.load(str(path), settings, record_calibration=False)
    print(f"| {args.model} (vocab {engine.n_vocab:,}) | sampler chain per sequence µs/step "
          "median · worst | one argmax µs/step median · worst | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|")
    try:
        for rows in row_counts:
            by_chain, by_argmax = measure(engine, rows, args.rounds, args.repeat)
            chain_median, argmax_median = statistics.median(by_chain), statistics.median(by_argmax)
            print(
                f"| {rows} sequences | {chain_median:,.1f} · {max(by_chain):,.1f} | "
                f"{argmax_median:,.1f} · {max(by_argmax):,.1f} | "
                f"{chain_median / argmax_median:.1f}x |",
                flush=True,
            )
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
