"""The offline model catalogue (profiles/models.toml) and the ModelInfo it builds."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from homelab.errors import ConfigError, PlanError
from homelab.gguf.catalogue import (
    CatalogueEntry,
    estimate_file_bytes,
    find_model,
    header_bytes_estimate,
    load_catalogue,
)
from homelab.gguf.model import ModelInfo

GIB = 1024**3
REQUIRED_SLUGS = {
    "llama-3.1-8b",
    "llama-3.3-70b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "qwen3-30b-a3b",
    "gemma-3-12b",
    "gemma-3-27b",
    "mistral-small-3.2-24b",
    "gpt-oss-20b",
    "deepseek-v3",
    "glm-4.5-air",
}
CATALOGUE = load_catalogue()
ENTRIES = sorted(CATALOGUE.values(), key=lambda entry: entry.slug)
ENTRY_QUANTS = [(entry, f.quant) for entry in ENTRIES for f in entry.quants]


def entry_id(value: object) -> str:
    return value.slug if isinstance(value, CatalogueEntry) else str(value)


def test_catalogue_has_the_popular_models() -> None:
    assert len(CATALOGUE) >= 12
    assert set(CATALOGUE) >= REQUIRED_SLUGS


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_every_entry_is_complete(entry: CatalogueEntry) -> None:
    assert entry.architecture in set(gguf.MODEL_ARCH_NAMES.values())
    assert entry.display_name and entry.source and "/" in entry.hf_repo and "/" in entry.base_repo
    for count in (entry.n_layer, entry.n_embd, entry.n_ff, entry.n_head, entry.n_head_kv):
        assert count > 0
    assert entry.head_dim_k > 0 and entry.head_dim_v > 0 and entry.n_vocab > 0 and entry.n_rot > 0
    assert entry.context_length >= 16384
    assert entry.quants, "at least one quant file"
    for quant_file in entry.quants:
        assert quant_file.file.endswith(".gguf") and quant_file.size_note
        assert quant_file.size_bytes > 1e9 and quant_file.n_files >= 1


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_hyperparameters_reproduce_the_stated_parameter_count(entry: CatalogueEntry) -> None:
    # The synthetic tensors are built from the hyperparameters alone; biases and q/k norms are
    # left out, so a small shortfall is expected and anything above 0.1% means a wrong number.
    info = entry.model_info(entry.quants[0].quant)
    assert info.n_params == pytest.approx(entry.n_params, rel=1e-3)


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_file_sizes_agree_with_the_quant_recipe(entry: CatalogueEntry) -> None:
    for quant_file in entry.quants:
        estimate = estimate_file_bytes(entry, quant_file.quant, quant_file.n_files)
        assert quant_file.size_bytes == pytest.approx(estimate, rel=0.01), quant_file.quant


def test_llama_3_1_8b_f16_kv_cache_at_32k_is_4_gib() -> None:
    info = find_model("llama-3.1-8b").model_info("Q4_K_M")
    head_dims = {info.head_dim_k, info.head_dim_v}
    assert (info.n_layer, set(info.n_head_kv), head_dims) == (32, {8}, {128})
    kv_bytes = info.n_layer * info.n_head_kv[0] * info.head_dim_k * 2 * 2 * 32768
    assert kv_bytes == 4 * GIB == 4294967296


def test_deepseek_is_mla_with_three_dense_layers() -> None:
    info = find_model("deepseek-v3").model_info("Q4_K_M")
    assert info.is_mla and info.is_moe
    assert (info.kv_lora_rank, info.n_rot, info.n_layer) == (512, 64, 61)
    assert (info.n_expert, info.n_expert_used, info.n_expert_shared) == (256, 8, 1)
    assert (info.head_dim_k, info.n_head_kv[0]) == (512 + 64, 1)
    dense = [layer for layer in range(info.n_layer) if not _expert_tensors(info, layer)]
    assert dense == [0, 1, 2]
    assert info.metadata["deepseek2.leading_dense_block_count"] == 3


@pytest.mark.parametrize(("entry", "quant"), ENTRY_QUANTS, ids=entry_id)
def test_tensor_bytes_sum_to_the_file_size(entry: CatalogueEntry, quant: str) -> None:
    info = entry.model_info(quant)
    assert info.weights_bytes == info.file_bytes - header_bytes_estimate(entry, info.n_files)
    assert info.weights_bytes == pytest.approx(info.file_bytes, rel=0.01)
    assert all(t.n_bytes > 0 for t in info.tensors)


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_tensors_are_ordered_and_placed_like_a_file(entry: CatalogueEntry) -> None:
    info = entry.model_info(entry.quants[-1].quant)
    names = [t.name for t in info.tensors]
    assert names[0] == "token_embd.weight"
    assert ("output.weight" in names) != entry.tied_embeddings
    assert names[-1] == ("output_norm.weight" if entry.tied_embeddings else "output.weight")
    layers = [t.layer for t in info.tensors if t.layer is not None]
    assert layers == sorted(layers) and set(layers) == set(range(info.n_layer))
    offsets = [t.offset for t in info.tensors]
    ends = [t.offset + t.n_bytes for t in info.tensors]
    assert offsets == [0, *ends[:-1]]


def test_expert_tensors_are_flagged() -> None:
    info = find_model("qwen3-30b-a3b").model_info("Q4_K_M")
    experts = [t.name for t in info.tensors if t.is_expert]
    assert len(experts) == 3 * 48
    assert {name.split(".")[2] for name in experts} == {
        "ffn_gate_exps",
        "ffn_up_exps",
        "ffn_down_exps",
    }
    gate = next(t for t in info.tensors if t.name == "blk.0.ffn_gate_exps.weight")
    assert gate.shape == (2048, 768, 128)
    expert_share = sum(t.n_bytes for t in info.tensors if t.is_expert) / info.weights_bytes
    assert 0.9 < expert_share < 0.97


def test_shared_experts_and_router_are_not_experts() -> None:
    info = find_model("glm-4.5-air").model_info("Q4_K_M")
    layer_names = {t.name: t.is_expert for t in info.layer_tensors(5)}
    assert layer_names["blk.5.ffn_shexp"] is False
    assert layer_names["blk.5.ffn_gate_inp.weight"] is False
    assert layer_names["blk.5.ffn_down_exps.weight"] is True


def test_glm_air_keeps_its_multi_token_prediction_layer() -> None:
    info = find_model("glm-4.5-air").model_info("Q4_K_M")
    assert info.n_layer == 47
    assert info.metadata["glm4moe.nextn_predict_layers"] == 1
    assert "blk.46.nextn" in {t.name for t in info.layer_tensors(46)}
    assert not _expert_tensors(info, 0) and _expert_tensors(info, 1)


def test_gemma_3_has_every_sixth_layer_global() -> None:
    info = find_model("gemma-3-27b").model_info("Q4_K_M")
    assert info.n_swa == 1024 and info.has_swa
    globals_ = [layer for layer, swa in enumerate(info.swa_layers) if not swa]
    assert globals_ == list(range(5, 62, 6))
    assert "output.weight" not in {t.name for t in info.tensors}  # tied embeddings


def test_gpt_oss_alternates_sliding_and_full_attention() -> None:
    info = find_model("gpt-oss-20b").model_info("MXFP4_MOE")
    assert info.architecture == "gpt-oss" and info.n_swa == 128
    assert info.swa_layers == (True, False) * 12
    experts = {t.type_name for t in info.tensors if t.is_expert}
    assert experts == {"MXFP4"}


def test_model_info_describes_its_origin() -> None:
    info = find_model("qwen3-8b").model_info("q4_k_m")
    assert info.source == "catalogue:qwen3-8b:Q4_K_M"
    assert info.file_type == "Q4_K_M"
    assert info.metadata["general.architecture"] == "qwen3"
    assert info.metadata["catalogue.hf_repo"] == "bartowski/Qwen_Qwen3-8B-GGUF"
    assert info.metadata["catalogue.file.size_estimated"] is True


def test_quants_are_listed_best_first() -> None:
    quants = find_model("llama-3.1-8b").quants
    assert [q.quant for q in quants] == ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M"]
    sizes = [q.size_bytes for q in quants]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(
    "name",
    [
        "qwen3-30b-a3b",
        "QWEN3-30B-A3B",
        "Qwen3 30B-A3B",
        "bartowski/Qwen_Qwen3-30B-A3B-GGUF",
        "Qwen/Qwen3-30B-A3B",
        "https://huggingface.co/Qwen/Qwen3-30B-A3B",
        "qwen3:30b-a3b",
    ],
)
def test_find_model_accepts_slug_name_repo_and_alias(name: str) -> None:
    assert find_model(name).slug == "qwen3-30b-a3b"


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(PlanError) as caught:
        find_model("llama-9-900b")
    assert "llama-9-900b" in str(caught.value)
    assert "llama-3.1-8b" in str(caught.value) and "gemma-3-27b" in str(caught.value)


def test_unknown_quant_lists_the_available_ones() -> None:
    with pytest.raises(PlanError, match="Q4_K_M"):
        find_model("deepseek-v3").model_info("IQ1_S")


def _write_catalogue(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(body, encoding="utf-8")
    return path


def _minimal_toml(extra: str = "", n_layer: str = "n_layer = 2") -> str:
    return f"""
[models.tiny]
display_name = "Tiny"
architecture = "llama"
hf_repo = "someone/Tiny-GGUF"
base_repo = "someone/Tiny"
source = "made up for a test"
n_params = 1000
context_length = 4096
{n_layer}
n_embd = 64
n_ff = 128
n_head = 4
n_head_kv = 2
head_dim_k = 16
head_dim_v = 16
n_vocab = 256
n_rot = 16
tokenizer_model = "llama"
{extra}
[[models.tiny.files]]
quant = "Q8_0"
file = "tiny-Q8_0.gguf"
size_bytes = 2000000
n_files = 1
size_estimated = true
size_note = "made up"
"""


def test_a_file_size_far_below_the_shapes_is_refused(tmp_path: Path) -> None:
    body = _minimal_toml().replace("n_embd = 64", "n_embd = 4096")
    path = _write_catalogue(tmp_path, body)
    with pytest.raises(ConfigError, match="far below"):
        find_model("tiny", path).model_info("Q8_0")


def test_a_valid_custom_catalogue_loads(tmp_path: Path) -> None:
    path = _write_catalogue(tmp_path, _minimal_toml())
    info = find_model("someone/tiny-gguf", path).model_info("Q8_0")
    assert info.n_layer == 2 and info.weights_bytes == 2000000 - header_bytes_estimate(
        find_model("tiny", path)
    )


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (_minimal_toml(n_layer=""), "missing required key 'n_layer'"),
        (_minimal_toml(n_layer='n_layer = "2"'), "n_layer must be int"),
        (_minimal_toml(extra="n_layers = 3"), "unknown keys ['n_layers']"),
        (_minimal_toml(extra="n_swa = 512"), "n_swa needs swa_pattern"),
        ("[models.tiny\n", "not valid TOML"),
    ],
)
def test_a_broken_catalogue_names_the_file_and_the_problem(
    tmp_path: Path, body: str, problem: str
) -> None:
    path = _write_catalogue(tmp_path, body)
    with pytest.raises(ConfigError) as caught:
        load_catalogue(path)
    assert str(path) in str(caught.value) and problem in str(caught.value)


def _expert_tensors(info: ModelInfo, layer: int) -> list[str]:
    return [t.name for t in info.layer_tensors(layer) if t.is_expert]
