"""The ggml tensor types a K/V cache can hold, by name, with their ``enum ggml_type`` ids.

The one table of type ids in homelab: the engine's context, the dry run and the quality
evaluator all pass K/V types to llama.cpp through :func:`ggml_type_id`. (The planner keeps
the bytes per block of each type for its arithmetic; that is not llama.cpp's business.)
"""

from __future__ import annotations

from homelab.errors import EngineError

# ggml.h `enum ggml_type` values of the types llama.cpp accepts for K and V
GGML_TYPE_IDS: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}


def ggml_type_id(name: str) -> int:
    """The ggml id of a K/V cache type name such as ``"q8_0"`` (case forgiven)."""
    try:
        return GGML_TYPE_IDS[name.lower()]
    except KeyError:
        raise EngineError(
            f"unknown KV cache type {name!r}", hint=f"Use one of {', '.join(GGML_TYPE_IDS)}."
        ) from None
