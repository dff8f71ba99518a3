"""llama.cpp's quantizer, ``llama_model_quantize``: a GGUF in, a GGUF of another type out.

:func:`quantize_gguf` writes the file (reporting per-tensor progress from llama.cpp's
``[  i/  n] tensor`` log lines); :func:`quantized_size_bytes` runs the quantizer's dry run,
which computes the output size without writing anything. Which labels exist, where files go
and what is recorded about them is ``homelab.gguf.quantize``'s business.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from homelab.errors import ModelFileError
from homelab.llamacpp._lib import lib, to_bytes
from homelab.llamacpp.log import capture_log, joined

# quant label -> enum llama_ftype (llama.h LLAMA_FTYPE_MOSTLY_*)
FILE_TYPES = {
    "F16": 1,
    "Q4_0": 2,
    "Q8_0": 7,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "Q4_K_M": 15,
    "Q4_K_S": 14,
    "Q5_K_S": 16,
    "Q3_K_M": 12,
    "IQ4_XS": 30,
    "IQ4_NL": 25,
    "BF16": 32,
    "Q5_0": 8,
    "Q3_K_L": 13,
    "Q3_K_S": 11,
    "Q2_K": 10,
}
_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]")
_QUANT_SIZE = re.compile(r"quant size\s*=\s*([\d.]+) MiB")
_PROGRESS_POLL_S = 0.2

Progress = Callable[[int, int], None]  # (tensors done, tensors in all)


def quantize_gguf(
    source: Path,
    target: Path,
    file_type: str,
    *,
    n_threads: int | None = None,
    allow_requantize: bool = True,
    keep_split: bool = False,
    progress: Progress | None = None,
) -> None:
    """Write ``source`` as ``file_type`` (a :data:`FILE_TYPES` label) to ``target``.

    ``keep_split`` writes a split source as a split set named after ``target``.
    """
    params = _params(file_type, n_threads, allow_requantize=allow_requantize)
    params.keep_split = keep_split
    with capture_log() as lines, _TensorProgress(lines, progress):
        status = lib().llama_model_quantize(to_bytes(source), to_bytes(target), params)
    if status != 0:
        raise _failure(source, file_type, status, joined(lines))


def quantized_size_bytes(source: Path, file_type: str) -> int:
    """The size ``file_type`` output would have, from the quantizer's dry run (milliseconds)."""
    params = _params(file_type, 1, dry_run=True)
    with tempfile.TemporaryDirectory() as scratch, capture_log() as lines:
        target = Path(scratch) / "dry-run.gguf"
        status = lib().llama_model_quantize(to_bytes(source), to_bytes(target), params)
    match = _QUANT_SIZE.search(joined(lines))
    if status != 0 or match is None:
        raise _failure(source, file_type, status, joined(lines))
    return int(float(match[1]) * (1 << 20))


def _params(
    file_type: str, n_threads: int | None, *, dry_run: bool = False, allow_requantize: bool = True
) -> Any:
    params = lib().llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.nthread = n_threads or os.cpu_count() or 1
    params.allow_requantize = allow_requantize  # Q8_0 -> Q4_K_M is a legitimate request
    params.dry_run = dry_run
    return params


def _failure(source: Path, file_type: str, status: int, log_text: str) -> ModelFileError:
    errors = [
        line.strip()
        for line in log_text.splitlines()
        if "error" in line.lower() or "failed" in line.lower()
    ]
    return ModelFileError(
        source,
        f"llama.cpp could not quantize it to {file_type} (status {status})",
        hint=errors[-1] if errors else "See the log for details.",
    )


class _TensorProgress:
    """Reports llama.cpp's ``[  i/  n] tensor`` log lines to ``progress`` from a side thread.

    ``llama_model_quantize`` blocks in C (without the GIL); its log lines arrive on the
    calling thread through the log capture, and this thread forwards the count.
    """

    def __init__(self, lines: list[str], progress: Progress | None) -> None:
        self._lines = lines
        self._progress = progress
        self._stop = threading.Event()
        self._seen = 0
        self._thread = threading.Thread(target=self._run, name="quantize-progress", daemon=True)

    def __enter__(self) -> _TensorProgress:
        if self._progress is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is None:
            return
        self._stop.set()
        self._thread.join()
        self._report(self._progress)

    def _run(self) -> None:
        assert self._progress is not None
        while not self._stop.wait(_PROGRESS_POLL_S):
            self._report(self._progress)

    def _report(self, progress: Progress) -> None:
        end = len(self._lines)
        new_lines, self._seen = self._lines[self._seen : end], end
        for line in reversed(new_lines):
            match = _TENSOR_LINE.match(line)
            if match:
                progress(int(match[1]), int(match[2]))
                return
