"""``python -m benchmarks.cache_index_bench``: prompt cache lookups against the states held.

    python -m benchmarks.cache_index_bench                 # 100, 1,000 and 5,000 states

Every admission on the compute lane asks the cache for the tenant's best saved prefix
(``lookup``), and every slot about to lose tokens asks whether a state already holds them
(``covers``) before it saves one (``put``, which drops the shorter states the new one extends).
A real model's states are large, but a small model's states, or a disk tier of many GiB, can
number in the thousands. Measured on plain bytes (no llama.cpp), in µs per call, median of
``--repeat`` calls, for two shapes of history: states whose prompts differ from their start
(many users, many chats) and states that share a 4,096-token system prompt (one coding agent,
many sessions). A harness, not a test.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable

from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache

MODEL = ModelKey("bench-model", "k=f16 v=f16 fa=0 cells=65536 streams=1 swa_full=0")
SYSTEM_TOKENS = 4096
STATE_TOKENS = 6144


def history(n_states: int, shared: bool, rng: random.Random) -> list[list[int]]:
    system = [rng.randrange(1000, 30000) for _ in range(SYSTEM_TOKENS)] if shared else []
    return [
        system + [rng.randrange(1000, 30000) for _ in range(STATE_TOKENS - len(system))]
        for _ in range(n_states)
    ]


def per_call_us(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def measure(n_states: int, shared: bool, repeat: int) -> dict[str, float]:
    rng = random.Random(n_states * 2 + shared)
    states = history(n_states, shared, rng)
    cache = PromptCache(CacheConfig(1 << 40, 0, None))
    for tokens in states:
        cache.put(MODEL, "agent", tokens, b"x")
    continuing = [*states[n_states // 2], *range(5000, 5300)]  # a session's next turn
    fresh = states[0][:SYSTEM_TOKENS] + [rng.randrange(1000, 30000) for _ in range(2000)]
    return {
        "lookup, next turn": per_call_us(lambda: cache.lookup(MODEL, "agent", continuing), repeat),
        "lookup, new chat": per_call_us(lambda: cache.lookup(MODEL, "agent", fresh), repeat),
        "covers": per_call_us(lambda: cache.covers(MODEL, "agent", continuing), repeat),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", default="100,1000,5000")
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args(argv)
    print("| states | history | lookup, next turn µs | lookup, new chat µs | covers µs |")
    print("|---:|---|---:|---:|---:|")
    for n_states in (int(n) for n in args.states.split(",")):
        for shared in (False, True):
            found = measure(n_states, shared, args.repeat)
            kind = f"{SYSTEM_TOKENS:,}-token system prompt shared" if shared else "distinct"
            print(
                f"| {n_states:,} | {kind} | {found['lookup, next turn']:,.0f} | "
                f"{found['lookup, new chat']:,.0f} | {found['covers']:,.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
