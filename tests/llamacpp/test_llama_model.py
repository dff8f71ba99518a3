"""The doorway's loader, context, batch, memory, logits and sampler on real demo models."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from homelab.errors import EngineError
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context, ContextCreateError, ContextParams
from homelab.llamacpp.model import Model, ModelLoadError, ModelParams
from homelab.llamacpp.sampler import SamplerChain


@pytest.fixture(scope="module")
def model(demo_model: Callable[..., Path]) -> Iterator[Model]:
    with Model.load(demo_model("llama")) as loaded:
        yield loaded


@pytest.fixture
def context(model: Model) -> Iterator[Context]:
    params = ContextParams(n_ctx=512, n_batch=64, n_ubatch=32, n_seq_max=2, n_threads=1)
    with Context.create(model, params) as created:
        yield created


def test_a_file_llama_cpp_refuses_keeps_its_reason(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError) as raised:
        Model.load(broken)
    assert isinstance(raised.value, EngineError) and not raised.value.for_memory
    assert raised.value.log_text and str(broken) in str(raised.value)


def test_the_dry_run_sizes_buffers_without_allocating(demo_model: Callable[..., Path]) -> None:
    dry = Model.load(demo_model("moe"), ModelParams(n_cpu_moe=2, allocate=False))
    with dry, Context.create(dry, ContextParams(n_ctx=1024)) as context:
        assert "llama_kv_cache: size =" in context.creation_log
        assert "compute buffer size" in context.creation_log
    assert dry.pointer is None and context.pointer is None  # both freed with the block


def test_llama_cpp_pads_the_context_and_caps_the_ubatch(context: Context) -> None:
    assert (context.n_ctx, context.n_ctx_per_seq, context.n_seq_max) == (512, 256, 2)
    assert (context.n_batch, context.n_ubatch) == (64, 32)
    with Context.create(context.model, ContextParams(n_ctx=1000, n_batch=16)) as padded:
        assert padded.n_ctx == 1024 and padded.n_ubatch == 16


def test_a_quantized_v_cache_without_flash_attention_is_refused(model: Model) -> None:
    params = ContextParams(n_ctx=512, type_v="q8_0", flash_attn=False)
    with pytest.raises(ContextCreateError) as raised:
        Context.create(model, params)
    assert "flash_attn" in raised.value.reason and not raised.value.for_memory


def test_an_unknown_cache_type_is_refused_before_llama_cpp(model: Model) -> None:
    with pytest.raises(EngineError, match="unknown KV cache type 'q3_0'"):
        Context.create(model, ContextParams(type_k="q3_0"))


def test_greedy_sampling_picks_the_top_logit(model: Model, context: Context) -> None:
    prompt = model.vocab.tokenize("the model is fast", add_bos=True, parse_special=False)
    batch = Batch(64)
    row = batch.add_run(prompt, 0, seq_id=0, output_last=True)
    assert row == len(prompt) - 1 and context.decode(batch) == 0
    chain = SamplerChain()
    chain.add_greedy()
    try:
        logits = context.logits_row(row)
        assert logits.shape == (model.vocab.n_tokens,)
        assert chain.sample(context, row) == int(np.argmax(logits))
    finally:
        chain.close()
        batch.close()


def test_sequences_are_kept_copied_and_cut_apart(model: Model, context: Context) -> None:
    memory = context.memory
    batch = Batch(64)
    batch.add_run(range(10, 30), 0, seq_id=0)
    assert context.decode(batch) == 0
    assert (memory.first_position(0), memory.last_position(0), memory.last_position(1)) == (
        0,
        19,
        -1,
    )
    with pytest.raises(EngineError, match="only whole sequences"):  # llama.cpp would abort
        memory.copy_sequence(0, 1, 0, 12)
    memory.copy_sequence(0, 1)
    assert memory.last_position(1) == 19
    assert memory.drop_from(0, 5) and memory.last_position(0) == 4
    memory.clear_sequence(1)
    assert memory.last_position(1) == -1
    memory.clear()
    assert memory.last_position(0) == -1
    batch.close()


def test_a_unified_cache_copies_part_of_a_sequence(model: Model) -> None:
    params = ContextParams(n_ctx=512, n_batch=64, n_seq_max=2, kv_unified=True, n_threads=1)
    with Context.create(model, params) as context:
        batch = Batch(64)
        batch.add_run(range(10, 30), 0, seq_id=0)
        assert context.decode(batch) == 0
        context.memory.copy_sequence(0, 1, 0, 12)
        assert context.memory.last_position(1) == 11
        batch.close()


def test_every_position_can_be_an_output(model: Model, context: Context) -> None:
    batch = Batch(64)
    batch.add_run(range(10, 26), 0, seq_id=0, output_all=True)
    assert context.decode(batch) == 0
    rows = context.all_logits(16)
    assert rows.shape == (16, model.vocab.n_tokens)
    assert np.array_equal(rows[7], context.logits_row(7))
    batch.close()


def test_a_batch_refuses_more_tokens_than_it_holds() -> None:
    batch = Batch(4)
    batch.add_run([1, 2, 3], 0, seq_id=0)
    with pytest.raises(EngineError, match="cannot take 5"):
        batch.add_run([4, 5], 3, seq_id=0)
    batch.clear()
    assert batch.add(7, 0, seq_id=0, output=True) == 0
    batch.close()
