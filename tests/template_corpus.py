"""The real chat templates and vocab-only tokenizers shipped in the llama-cpp-python sdist.

Found where ``benchmarks/llama_tools.py`` finds the sources (``HOMELAB_LLAMA_SRC``, /tmp/src,
the user cache), downloaded with pip once when absent; never copied into the repository.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@cache
def llama_cpp_models() -> Path:
    """``vendor/llama.cpp/models`` of the installed llama-cpp-python's sdist."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from benchmarks.llama_tools import find_sources

    return find_sources() / "models"


def templates_dir() -> Path:
    return llama_cpp_models() / "templates"


def vocab_file(name: str) -> Path:
    return llama_cpp_models() / f"ggml-vocab-{name}.gguf"
