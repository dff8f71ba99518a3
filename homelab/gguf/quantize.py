"""Quantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from homelab.errors import ModelFileError

# quant label -> llama_ftype value (llama.h LLAMA_FTYPE_MOSTLY_*)
FTYPES = {
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
}


def quantize_file(source: Path, target: Path, quant: str, n_threads: int | None = None) -> Path:
    """Write ``source`` quantized to ``quant`` at ``target`` (atomic; never touches source)."""
    from homelab.llamacpp import capture_log, llama

    llama_cpp = llama()
    ftype = FTYPES.get(quant.upper())
    if ftype is None:
        raise ModelFileError(
            source,
            f"cannot quantize to {quant!r}",
            hint=f"Choose one of {', '.join(sorted(FTYPES))}.",
        )
    if target.resolve() == source.resolve():
        raise ModelFileError(
            target, "the output would overwrite the source file", hint="Choose another output path."
        )
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = n_threads or os.cpu_count() or 1
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".partial", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    try:
        with capture_log():  # llama.cpp prints every tensor; keep the terminal clean
            status = llama_cpp.llama_model_quantize(
                str(source).encode(), str(tmp_path).encode(), params
            )
        if status != 0:
            raise ModelFileError(
                source, f"llama.cpp failed to quantize it to {quant} (status {status})"
            )
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)
    return target
