"""homelab's own time per step, where the machine's drift cannot hide it: the gap between one
``llama_decode``'s return and the next one's start, in a process that runs an engine.

On this 2-core VM the decode's own speed drifts by up to 2x within minutes, so a tok/s ratio
against llama.cpp's tools cannot show a change of a few µs per step; this gap does (its
median over a run). ``step_bench`` reports it per row, the GPU script at real GPU step times.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from typing import Any

Decodes = list[tuple[float, float]]  # (start, end) of each llama_decode, perf_counter seconds


def time_decodes() -> Decodes:
    """From now on, record every ``llama_decode`` of this process (the engine reads
    llama-cpp-python's module attribute at each call, or once for a run of steady steps;
    the wrapper costs ~0.3 µs). Clear the list to start a new measurement."""
    import llama_cpp

    real = llama_cpp.llama_decode
    decodes: Decodes = []
    clock = time.perf_counter

    def timed(*args: Any) -> int:
        started = clock()
        status = int(real(*args))
        decodes.append((started, clock()))
        return status

    llama_cpp.llama_decode = timed
    return decodes


def between_decodes_us(decodes: Decodes) -> float:
    """The median gap between one decode's return and the next one's start, the prefill
    steps (the first two) and the last one left out; NaN when there are too few."""
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(decodes[2:-1])]
    return statistics.median(gaps) * 1e6 if gaps else math.nan
