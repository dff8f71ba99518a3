"""``python -m benchmarks.prompt_cache_put_bench``: how long ``PromptCache.put`` holds the
compute lane once the RAM tier is full.

    python -m benchmarks.prompt_cache_put_bench                  # 48 states of 32 MiB, 256 MiB
    python -m benchmarks.prompt_cache_put_bench --gap-ms 0       # saves back to back

``put`` runs on the compute lane (a slot is about to lose its cells): while it runs, no
request of any model advances. Each state beyond a full RAM tier pushes older ones to disk.
This saves ``--states`` states of ``--state-mib`` through a ``--ram-mib`` tier over a disk tier
in a temporary folder (``--dir``: on the disk to measure), one every ``--gap-ms`` (admissions
are that far apart), and reports each ``put``'s time on the caller's thread, how many states
were skipped (saved while the RAM was full of states not yet written), and how long the
writer took to catch up. Plain bytes, no llama.cpp: the store is what is measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.units import MIB

MODEL = ModelKey("bench-model", "k=f16 v=f16 fa=0 cells=65536 streams=1 swa_full=0")


def run(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    cache = PromptCache(CacheConfig(args.ram_mib * MIB, 1 << 40, folder, min_tokens=1))
    put_s: list[float] = []
    for index in range(args.states):
        data = bytes([index % 251]) * (args.state_mib * MIB)
        tokens = [1, index + 2, *range(100, 612)]
        started = time.perf_counter()
        cache.put(MODEL, f"tenant-{index % 4}", tokens, data)
        put_s.append(time.perf_counter() - started)
        time.sleep(args.gap_ms / 1000)
    started = time.perf_counter()
    cache.wait_for_writes()
    catch_up_s = time.perf_counter() - started
    stats = cache.stats()
    cache.close()
    return {
        "put median ms": statistics.median(put_s) * 1e3,
        "put max ms": max(put_s) * 1e3,
        "put total s": sum(put_s),
        "skipped": getattr(stats, "skipped", 0),
        "spilled": stats.spilled,
        "writer catch-up s": catch_up_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=48)
    parser.add_argument("--state-mib", type=int, default=32)
    parser.add_argument("--ram-mib", type=int, default=256)
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--dir", type=Path, help="where the disk tier goes (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        results = run(args, Path(folder))
    for name, value in results.items():
        print(f"{name:>20}: {value:.1f}" if isinstance(value, float) else f"{name:>20}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
