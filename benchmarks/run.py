"""``python -m benchmarks.run``: build llama.cpp's tools if needed, then compare the engine.

    python -m benchmarks.run                    # bench demo model (Q8_0), 2 threads, 3 rounds
    python -m benchmarks.run --rounds 5 --threads 2 --model path/to/model.gguf
    python -m benchmarks.run --build-only       # just build llama-bench & co.

Results print as a markdown table and are saved under ``benchmarks/out/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.engine_bench import BenchConfig, markdown, measure, ratios, save
from benchmarks.llama_tools import HERE, build_tools


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF to run (default: the bench demo, Q8_0)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--flash-attn", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", default="8,16", help="concurrent streams to compare (8,16)")
    parser.add_argument("--ttft-prefix", type=int, default=2000, help="prompt tokens for TTFT")
    parser.add_argument(
        "--min-idle",
        type=float,
        default=0.8,
        help="wait for this share of idle CPU before each measurement (0.8)",
    )
    parser.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait for it")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (2)")
    args = parser.parse_args(argv)
    build_tools(args.jobs)
    if args.build_only:
        return 0
    model = args.model
    if model is None:
        from homelab.gguf.demo import demo_model_path

        model = demo_model_path("llama", "bench", "Q8_0")
    config = BenchConfig(
        model=Path(model),
        threads=args.threads,
        flash_attn=args.flash_attn,
        rounds=args.rounds,
        streams=tuple(int(n) for n in args.streams.split(",")),
        ttft_prefix_tokens=args.ttft_prefix,
        min_idle=args.min_idle,
        max_wait_s=args.max_wait,
    )
    print(
        f"model {config.model} · threads {config.threads} · flash attention "
        f"{'on' if config.flash_attn else 'off'} · {config.rounds} rounds",
        file=sys.stderr,
    )
    series = measure(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    found = ratios(series, config)
    print(markdown(series, found))
    print(f"saved {save(series, found, config, HERE / 'out')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
