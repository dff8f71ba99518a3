"""``python -m benchmarks.prompt_cache_bench``: time to first token, cold vs a restored prefix.

    python -m benchmarks.prompt_cache_bench                     # bench demo model, 3 rounds
    python -m benchmarks.prompt_cache_bench --sizes 1024,4096 --rounds 5 --model m.gguf

For each prefix size, every round takes a new prompt of that many tokens (random ids, one
slot, greedy, one token out) through three moments a homelab owner meets:

- **cold**: nothing cached — the whole prompt is prefilled;
- **RAM**: another tenant's request took the only slot (the prefix was saved to the RAM
  tier), then the same prompt again: restored instead of prefilled;
- **disk**: the cache was flushed and a new engine opened on a new cache over the same data
  folder (a restart): restored from the file. The file was just written, so it is read from
  the page cache — a cold disk read adds the file size over the disk's read rate.

Reported per size and moment: the median and the worst TTFT over the rounds, the tokens
reported cached, the state's size, and cold / restored.

``--bound N`` instead sends N distinct prefixes of ``--sizes``' first size through one engine
with ``--ram-mib`` of RAM and ``--disk-mib`` of disk, and reports the process's RSS growth
(sampled after every request), the tiers' peaks and what is left. A harness, not a test:
nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.gguf.reader import read_model
from homelab.settings import Settings
from homelab.units import GIB

ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1)
MOMENTS = ("cold", "ram", "disk")


@dataclass
class Series:
    ttft_s: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MOMENTS})
    cached: dict[str, list[int]] = field(default_factory=lambda: {m: [] for m in MOMENTS})
    state_bytes: int = 0


def settings_for(n_ctx: int, threads: int | None) -> Settings:
    return Settings(
        n_ctx=n_ctx, n_ctx_per_slot=n_ctx, n_parallel=1, n_batch=2048, n_ubatch=512,
        n_threads=threads,
    )  # fmt: skip


def random_prompt(rng: random.Random, size: int, n_vocab: int) -> tuple[int, ...]:
    """BOS, then ``size - 1`` ordinary token ids (above the byte and special tokens)."""
    return (1, *(rng.randrange(300, min(30000, n_vocab)) for _ in range(size - 1)))


def ttft(engine: Engine, tenant: str, prompt: tuple[int, ...]) -> tuple[float, int]:
    started = time.perf_counter()
    handle = engine.submit(GenerationRequest(tenant, prompt, ONE_TOKEN))
    completion = handle.collect()
    stats = completion.finish.stats
    return stats.ttft_s or time.perf_counter() - started, stats.cached_tokens


def one_round(
    model: Path, settings: Settings, prompt: tuple[int, ...], folder: Path, series: Series
) -> None:
    config = CacheConfig(4 * GIB, 16 * GIB, folder, min_tokens=256)
    cache = PromptCache(config)
    with Engine.load(model, settings, record_calibration=False, prompt_cache=cache) as engine:
        for moment, tenant in (("cold", "alice"), (None, "bob"), ("ram", "alice")):
            asked = prompt if tenant == "alice" else prompt[:64]
            seconds, cached = ttft(engine, tenant, asked)
            if moment is not None:
                series.ttft_s[moment].append(seconds)
                series.cached[moment].append(cached)
    series.state_bytes = max((e.n_bytes for e in cache.entries()), default=0)
    cache.close()
    restarted = PromptCache(config)
    with Engine.load(model, settings, record_calibration=False, prompt_cache=restarted) as engine:
        seconds, cached = ttft(engine, "alice", prompt)
        series.ttft_s["disk"].append(seconds)
        series.cached["disk"].append(cached)
    restarted.clear()
    restarted.close()


def measure(model: Path, sizes: list[int], rounds: int, threads: int | None) -> dict[int, Series]:
    results: dict[int, Series] = {}
    rng = random.Random(26)
    n_vocab = read_model(model).n_vocab
    for size in sizes:
        n_ctx = max(1024, -(-(size + 64) // 256) * 256)
        settings = settings_for(n_ctx, threads)
        series = Series()
        for _ in range(rounds):
            prompt = random_prompt(rng, size, n_vocab)
            with tempfile.TemporaryDirectory(prefix="prompt-cache-bench-") as folder:
                one_round(model, settings, prompt, Path(folder), series)
        results[size] = series
        print(row(size, series), flush=True)
    return results


def row(size: int, series: Series) -> str:
    cold = statistics.median(series.ttft_s["cold"])
    cells = [f"{size:,}", f"{series.state_bytes / (1 << 20):.0f} MiB"]
    for moment in MOMENTS:
        times = series.ttft_s[moment]
        cells.append(f"{statistics.median(times) * 1000:.0f} / {max(times) * 1000:.0f} ms")
        cells.append(f"{min(series.cached[moment])}")
    for moment in ("ram", "disk"):
        cells.append(f"{cold / statistics.median(series.ttft_s[moment]):.0f}x")
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| prefix tokens | state | cold median / worst | cached | RAM median / worst | cached "
    "| disk median / worst | cached | cold / RAM | cold / disk |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def bound(
    model: Path, size: int, n_prefixes: int, ram_mib: int, disk_mib: int, threads: int | None
) -> dict[str, object]:
    """N distinct prefixes through small tiers: RSS growth and the tiers' peaks."""
    import psutil

    process, rng = psutil.Process(), random.Random(64)
    n_vocab = read_model(model).n_vocab
    settings = settings_for(max(1024, -(-(size + 64) // 256) * 256), threads)
    with tempfile.TemporaryDirectory(prefix="prompt-cache-bound-") as folder:
        cache = PromptCache(CacheConfig(ram_mib << 20, disk_mib << 20, Path(folder), 256))
        with Engine.load(model, settings, record_calibration=False, prompt_cache=cache) as engine:
            ttft(engine, "warm-up", random_prompt(rng, size, n_vocab))
            rss_start = peak_rss = process.memory_info().rss
            peak_ram = peak_disk = 0
            for _ in range(n_prefixes):
                prompt = random_prompt(rng, size, n_vocab)
                ttft(engine, "alice", prompt)
                stats = cache.stats()
                peak_ram, peak_disk = (
                    max(peak_ram, stats.ram_bytes),
                    max(peak_disk, stats.disk_bytes),
                )
                peak_rss = max(peak_rss, process.memory_info().rss)
            cache.wait_for_writes()
            files = sum(p.stat().st_size for p in Path(folder).rglob("*.state"))
            final = cache.stats()
        cache.close()
    return {
        "prefixes": n_prefixes, "prefix_tokens": size, "ram_budget_mib": ram_mib,
        "disk_cap_mib": disk_mib, "rss_growth_mib": (peak_rss - rss_start) / (1 << 20),
        "peak_ram_mib": peak_ram / (1 << 20), "peak_disk_mib": peak_disk / (1 << 20),
        "files_mib": files / (1 << 20), "kept": final.ram_entries + final.disk_entries,
        "evicted": final.evicted, "saves": final.saves,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the bench demo model)")
    parser.add_argument("--sizes", default="1024,2048,4096,8000", help="prefix sizes in tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--bound", type=int, metavar="N", help="N distinct prefixes instead")
    parser.add_argument("--ram-mib", type=int, default=64, help="with --bound (64)")
    parser.add_argument("--disk-mib", type=int, default=256, help="with --bound (256)")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        from homelab.gguf.demo import demo_model_path

        model = demo_model_path("llama", "bench", "F16")
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.bound:
        figures = bound(model, sizes[0], args.bound, args.ram_mib, args.disk_mib, args.threads)
        print(json.dumps(figures, indent=2))
        return 0
    print(HEADER, flush=True)
    results = measure(model, sizes, args.rounds, args.threads)
    if args.json:
        raw = {size: {"ttft_s": s.ttft_s, "cached": s.cached, "state_bytes": s.state_bytes}
               for size, s in results.items()}  # fmt: skip
        args.json.write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
