"""``python -m benchmarks.image_bench``: image encode time and tokens per image.

    python -m benchmarks.image_bench                  # both generated vision models, 7 rounds
    python -m benchmarks.image_bench --rounds 11 --threads 2
    python -m benchmarks.image_bench --gpu            # the device script: all on the GPU

For each generated vision model (``homelab demo-model --vision KIND``: random weights, real
mtmd) and a few image sizes: the tokens mtmd gives the image, the projector's encode time
(``Projector.encode``: preprocessing excluded, the vision tower and projection only), and the
time to first token of a one-image chat through the engine, cold (the image read) and the
same image again for the same tenant (read from the prefix cache). Reported: the median and
the worst of the rounds after the first, and the first. A harness, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from benchmarks.engine_bench import wait_for_quiet
from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.gguf import demo_vision
from homelab.images.decoded import DecodedImage
from homelab.llamacpp.mtmd import Projector
from homelab.settings import Settings

SIZES_PX = ((224, 224), (448, 336), (896, 896))


def picture(width_px: int, height_px: int, seed: int) -> DecodedImage:
    pixels = np.random.default_rng(seed).integers(0, 256, width_px * height_px * 3, np.uint8)
    return DecodedImage(pixels.tobytes(), width_px, height_px)


def load(kind: str, threads: int, gpu: bool = False) -> Engine:
    """The generated pair; ``gpu``: every layer and the projector on the GPU (the device
    script), else both on the CPU."""
    settings = Settings(
        n_ctx=4096,
        n_ctx_per_slot=2048,
        n_parallel=2,
        n_threads=threads,
        n_batch=2048,
        n_ubatch=1024,
        mmproj_path=str(demo_vision.mmproj_path(kind)),
        mmproj_offload=gpu,
        n_gpu_layers=999 if gpu else 0,
    )
    return Engine.load(demo_vision.text_model_path(kind), settings, record_calibration=False)


def ttft_s(engine: Engine, image: DecodedImage, tenant: str) -> float:
    text = f"<|im_start|>user\n{engine.image_marker}What is it?<|im_end|>\n<|im_start|>assistant\n"
    prompt = engine.tokenize_images(text, [image])
    sampling = SamplingParams(temperature=0.0, max_tokens=1)
    request = GenerationRequest(tenant, prompt.tokens, sampling, images=prompt)
    return engine.submit(request).collect().finish.stats.ttft_s


def summary(values: list[float], scale: float = 1000.0) -> str:
    """median · worst of the rounds after the first [first], in ms."""
    rest = values[1:] or values
    return (
        f"{statistics.median(rest) * scale:.1f} · {max(rest) * scale:.1f} [{values[0] * scale:.1f}]"
    )


QUIET = {"min_idle": 0.8, "max_wait_s": 60.0}  # set from the command line


def measure(rounds: int, run: Callable[[int], float]) -> list[float]:
    """``run`` once per round, each after the CPUs are mostly idle (other processes)."""
    values = []
    for index in range(rounds):
        wait_for_quiet(
            QUIET["min_idle"], QUIET["max_wait_s"], lambda line: print(line, file=sys.stderr)
        )
        values.append(run(index))
    return values


def bench_image(engine: Engine, projector: Projector, image: DecodedImage, rounds: int) -> str:
    encodes = measure(rounds, lambda _: projector.encode(image).encode_s)
    n_tokens = projector.encode(image).n_tokens
    size = f"{image.width_px}x{image.height_px}"
    cold = measure(rounds, lambda i: ttft_s(engine, image, f"cold-{size}-{i}"))
    ttft_s(engine, image, "warm")
    ttft_s(engine, image, "warm")  # the first after a large batch re-plans llama.cpp's graph
    warm = measure(rounds, lambda _: ttft_s(engine, image, "warm"))
    return f"| {size} | {n_tokens} | {summary(encodes)} | {summary(cold)} | {summary(warm)} |"


def bench_kind(kind: str, rounds: int, threads: int, gpu: bool = False) -> list[str]:
    rows = []
    with load(kind, threads, gpu) as engine:
        projector = engine.projector
        assert projector is not None
        for width_px, height_px in SIZES_PX:
            image = picture(width_px, height_px, seed=width_px)
            rows.append(f"| {kind} {bench_image(engine, projector, image, rounds)}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="model and projector on the GPU")
    parser.add_argument("--min-idle", type=float, default=0.8, help="idle CPU share to wait for")
    parser.add_argument("--max-wait-s", type=float, default=60.0, help="then measure anyway")
    args = parser.parse_args(argv)
    QUIET.update(min_idle=args.min_idle, max_wait_s=args.max_wait_s)
    print(f"rounds {args.rounds}, threads {args.threads}, {time.strftime('%Y-%m-%d %H:%M')}")
    print("| model | image | tokens | encode ms | TTFT cold ms | TTFT cached ms |")
    print("|---|---|---:|---:|---:|---:|")
    for kind in demo_vision.VISION_KINDS:
        for row in bench_kind(kind, args.rounds, args.threads, args.gpu):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
