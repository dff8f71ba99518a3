"""``python -m benchmarks.sampling_bench``: picking greedy tokens, per sequence or per batch;
with ``--sampled``, a sampled request's pick over the whole vocabulary or its top-k first.

    python -m benchmarks.sampling_bench                    # demo:bench (32,000 tokens), 1/8/32 rows
    python -m benchmarks.sampling_bench --model demo:llama:tiny:F16
    python -m benchmarks.sampling_bench --sampled          # 32K real rows, 152K synthetic rows

llama.cpp's sampler chain copies the whole vocabulary into a candidate array for every
sequence it samples (``llama_sampler_sample``): linear in the vocabulary (32K for Llama 2,
128K for Llama 3, 152K for Qwen, 262K for Gemma 3), once per sequence per step, on the CPU —
while a GPU's step for an 8B model is ~6 ms. The engine picks the tokens of a step's plain
greedy sequences with one numpy argmax over the step's output rows instead
(``homelab.engine.emit.Emitter.sample_greedy``). This measures both on the logits of a real
decode of ``--rows`` sequences: the sampler chain row by row against the one argmax,
alternated over ``--rounds`` rounds of ``--repeat`` picks each; median and worst round. A
harness, not a test.

``--sampled`` does the same for a sampled request (top-k 40, top-p 0.95, min-p 0.05,
temperature 0.8, a seed): ``llama_sampler_sample`` over the whole row against the engine's
``SamplerChain.sample``, which hands the chain only the tokens that can survive its top-k
(``homelab.engine.sampling.top_candidates``) — on the bench model's real rows, and on random
rows of 152,064 logits (Qwen's vocabulary size), which no demo model has.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

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


SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=42)


def measure_sampled(engine: Engine, rounds: int, repeat: int) -> tuple[list[float], list[float]]:
    """(whole-row µs per pick, top-k-first µs per pick) per round, on one decode's row."""
    from homelab.engine import sampling

    whole = SamplerChain(SAMPLED, engine._vocab, engine.n_vocab, engine.eog_tokens)
    threshold, sampling.TOP_K_FIRST_MIN_VOCAB = sampling.TOP_K_FIRST_MIN_VOCAB, 0
    try:  # top-k first whatever the vocabulary's size (the engine's threshold aside)
        first = SamplerChain(SAMPLED, engine._vocab, engine.n_vocab, engine.eog_tokens)
    finally:
        sampling.TOP_K_FIRST_MIN_VOCAB = threshold
    context = engine._loaded.context

    def run() -> tuple[list[float], list[float]]:
        batch = Batch(1)
        batch.add(engine.bos_token_id or 1, 0, 0, output=True)
        status = context.decode(batch)
        batch.close()
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status})")
        by_whole_row = whole._chain.sample  # llama_sampler_sample over the row
        return _alternate(
            lambda: by_whole_row(context, 0), lambda: first.sample(context, 0), rounds, repeat
        )

    try:
        return engine.run_on_engine_thread(run).result(600)
    finally:
        whole.close()
        first.close()
        engine.run_on_engine_thread(lambda: context.memory.clear()).result(60)


def measure_synthetic(n_vocab: int, rounds: int, repeat: int) -> tuple[list[float], list[float]]:
    """The same on random rows of ``n_vocab`` logits (no model), through the chain's
    candidate API: the whole vocabulary as candidates against ``top_candidates``'s few."""
    import numpy as np

    from homelab.engine.sampling import top_candidates
    from homelab.llamacpp.sampler import SamplerChain as CChain

    chains = []
    for _ in range(2):
        chain = CChain()
        chain.add_top_k(40)
        chain.add_top_p(0.95)
        chain.add_min_p(0.05)
        chain.add_temperature(0.8)
        chain.add_random_pick(42)
        chains.append(chain)
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
    every_id = np.arange(n_vocab)

    def few() -> int:
        ids = top_candidates(row, 40)
        assert ids is not None
        return chains[1].pick(ids, row[ids])

    try:
        return _alternate(lambda: chains[0].pick(every_id, row), few, rounds, repeat)
    finally:
        for chain in chains:
            chain.close()


def _alternate(
    one: Callable[[], int], other: Callable[[], int], rounds: int, repeat: int
) -> tuple[list[float], list[float]]:
    """µs per call of each, ``repeat`` calls a round, the two taking turns."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for pick, out in ((one, times[0]), (other, times[1])):
            started = time.perf_counter()
            for _ in range(repeat):
                pick()
            out.append(1e6 * (time.perf_counter() - started) / repeat)
    return times


def sampled_table(engine: Engine, model: str, rounds: int, repeat: int) -> None:
    print(
        "| sampled pick (top-k 40, top-p, min-p, temperature) | whole row µs median · worst "
        "| top-k first µs median · worst | ratio |"
    )
    print("|---|---:|---:|---:|")
    real = f"{model}, a real row of {engine.n_vocab:,}"
    cases = (
        (real, lambda: measure_sampled(engine, rounds, repeat)),
        ("random row of 152,064", lambda: measure_synthetic(152064, rounds, repeat)),
    )
    for label, measure_case in cases:
        whole, first = measure_case()
        print(
            f"| {label} | {statistics.median(whole):,.1f} · {max(whole):,.1f} | "
            f"{statistics.median(first):,.1f} · {max(first):,.1f} | "
            f"{statistics.median(whole) / statistics.median(first):.1f}x |",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo:bench:Q8_0")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--sampled", action="store_true", help="sampled picks, not greedy")
    args = parser.parse_args(argv)
    row_counts = [int(r) for r in args.rows.split(",")]
    path = demo_ref_path(args.model) if args.model.startswith("demo:") else args.model
    most = max(row_counts)
    settings = Settings(n_ctx=64 * most, n_ctx_per_slot=64, n_parallel=most)
    engine = Engine.load(str(path), settings, record_calibration=False)
    if args.sampled:
        try:
            sampled_table(engine, args.model, args.rounds, args.repeat)
        finally:
            engine.close()
        return 0
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
