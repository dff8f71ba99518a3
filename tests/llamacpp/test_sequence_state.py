"""A sequence's state to bytes and back (llama_state_seq_*), on real generated models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context, ContextParams
from homelab.llamacpp.model import Model
from homelab.llamacpp.state import (
    SequenceStateError,
    restore_sequence,
    save_sequence,
    state_size_bytes,
)

PROMPT = list(range(10, 40))


def _decode(context: Context, tokens: list[int], start: int, seq_id: int) -> np.ndarray:
    batch = Batch(64)
    batch.add_run(tokens, start, seq_id=seq_id, output_last=True)
    assert context.decode(batch) == 0
    logits = context.logits_row(-1).copy()
    batch.close()
    return logits


def test_a_saved_sequence_restores_into_another_and_computes_the_same(
    demo_model: Callable[..., Path],
) -> None:
    params = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=2, n_threads=1)
    with Model.load(demo_model("llama")) as model, Context.create(model, params) as context:
        _decode(context, PROMPT, 0, seq_id=0)
        state = save_sequence(context.pointer, 0)
        assert len(state) == state_size_bytes(context.pointer, 0) > 0
        assert restore_sequence(context.pointer, 1, state) == len(state)
        assert context.memory.last_position(1) == len(PROMPT) - 1
        after_original = _decode(context, [7], len(PROMPT), seq_id=0)
        after_restored = _decode(context, [7], len(PROMPT), seq_id=1)
        np.testing.assert_allclose(after_restored, after_original, rtol=1e-5, atol=1e-5)


def test_bytes_that_are_no_state_are_refused_and_leave_the_sequence_empty(
    demo_model: Callable[..., Path],
) -> None:
    params = ContextParams(n_ctx=256, n_batch=64, n_seq_max=1, n_threads=1)
    with Model.load(demo_model("llama")) as model, Context.create(model, params) as context:
        _decode(context, PROMPT, 0, seq_id=0)
        state = save_sequence(context.pointer, 0)
        with pytest.raises(SequenceStateError, match="refused"):
            restore_sequence(context.pointer, 0, state[: len(state) // 2])  # truncated
        context.memory.clear_sequence(0)
        with pytest.raises(SequenceStateError, match="refused"):
            restore_sequence(context.pointer, 0, b"\0" * 64)
        assert context.memory.last_position(0) == -1


def test_a_state_from_another_layout_is_refused(demo_model: Callable[..., Path]) -> None:
    """Two streams (one per slot) vs one: llama.cpp checks the stream count."""
    two = ContextParams(n_ctx=512, n_batch=64, n_seq_max=2, n_threads=1)
    one = ContextParams(n_ctx=512, n_batch=64, n_seq_max=1, n_threads=1)
    with Model.load(demo_model("llama")) as model:
        with Context.create(model, two) as context:
            _decode(context, PROMPT, 0, seq_id=0)
            state = save_sequence(context.pointer, 0)
        with Context.create(model, one) as other, pytest.raises(SequenceStateError):
            restore_sequence(other.pointer, 0, state)


def test_the_partial_state_of_a_sliding_window_model_is_its_window_cache_alone(
    demo_model: Callable[..., Path],
) -> None:
    params = ContextParams(n_ctx=512, n_batch=64, n_seq_max=1, n_threads=1, swa_full=False)
    with Model.load(demo_model("gemma3")) as model, Context.create(model, params) as context:
        _decode(context, PROMPT, 0, seq_id=0)
        full = save_sequence(context.pointer, 0)
        partial = save_sequence(context.pointer, 0, partial=True)
        assert 0 < len(partial) < len(full)
        context.memory.clear_sequence(0)
        assert restore_sequence(context.pointer, 0, full) == len(full)
        assert context.memory.last_position(0) == len(PROMPT) - 1
