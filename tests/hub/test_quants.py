"""Reading a repo's file list: quant labels, split sets, selection (no network)."""

from __future__ import annotations

import pytest

from homelab.errors import HubError
from homelab.hub.quants import (
    ModelRef,
    RemoteFile,
    group_entries,
    parse_model_ref,
    projector_files,
    quant_label,
    select_entry,
)


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("Qwen3-8B-Q4_K_M.gguf", "Q4_K_M"),
        ("Meta-Llama-3-8B-Instruct.Q8_0.gguf", "Q8_0"),
        ("gemma-3-4b-it-qat-q4_0.gguf", "Q4_0"),
        ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Llama-3.1-8B-IQ4_XS.gguf", "IQ4_XS"),
        ("model-bf16-00001-of-00003.gguf", "BF16"),
        ("qwen2.5-7b-instruct-fp16-00001-of-00004.gguf", "F16"),
        ("Q4_K_M/DeepSeek-R1-00001-of-00009.gguf", "Q4_K_M"),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("mystery-model.gguf", "?"),
    ],
)
def test_quant_label_from_file_or_folder_name(path: str, label: str) -> None:
    assert quant_label(path) == label


def _files(*names: str) -> list[RemoteFile]:
    return [RemoteFile(name, 1000 * (i + 1), f"{i:064x}", None) for i, name in enumerate(names)]


def test_split_set_is_one_entry_with_the_sum_of_its_parts() -> None:
    files = _files(
        "M-Q4_K_M.gguf",
        "Q8_0/M-Q8_0-00002-of-00002.gguf",
        "Q8_0/M-Q8_0-00001-of-00002.gguf",
        "README.md",
        "mmproj-M-F16.gguf",
    )
    entries = group_entries(files)
    assert [e.quant for e in entries] == ["Q8_0", "Q4_K_M"]  # largest first
    split = entries[0]
    assert split.is_split and split.total_bytes == 2000 + 3000
    assert [f.path for f in split.files] == [
        "Q8_0/M-Q8_0-00001-of-00002.gguf",
        "Q8_0/M-Q8_0-00002-of-00002.gguf",
    ]
    assert [f.path for f in projector_files(files)] == ["mmproj-M-F16.gguf"]


def test_incomplete_split_set_is_listed_but_cannot_be_selected() -> None:
    entries = group_entries(_files("M-Q6_K-00001-of-00003.gguf", "M-Q6_K-00003-of-00003.gguf"))
    assert entries[0].missing_parts == ("M-Q6_K-00002-of-00003.gguf",)
    with pytest.raises(HubError, match="incomplete"):
        select_entry("org/m", entries, "Q6_K")


def test_selection_by_quant_any_case_unsloth_prefix_or_path() -> None:
    entries = group_entries(_files("M-Q4_K_M.gguf", "M-UD-Q4_K_XL.gguf", "M-Q8_0.gguf"))
    assert select_entry("org/m", entries, "q4_k_m").first_path == "M-Q4_K_M.gguf"
    assert select_entry("org/m", entries, "Q4_K_XL").quant == "UD-Q4_K_XL"
    assert select_entry("org/m", entries, "M-Q8_0.gguf").quant == "Q8_0"
    with pytest.raises(HubError, match=r"no GGUF file for 'Q2_K'.*Available: "):
        select_entry("org/m", entries, "Q2_K")


def test_ambiguous_selection_names_the_files() -> None:
    entries = group_entries(_files("A-Q4_K_M.gguf", "B-Q4_K_M.gguf"))
    with pytest.raises(HubError, match="matches several files"):
        select_entry("org/m", entries, "Q4_K_M")


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("unsloth/Qwen3-8B-GGUF", ModelRef("unsloth/Qwen3-8B-GGUF")),
        ("unsloth/Qwen3-8B-GGUF:Q4_K_M", ModelRef("unsloth/Qwen3-8B-GGUF", "Q4_K_M")),
        ("models/llama.gguf", None),
        ("/abs/path/model.gguf", None),
        ("just-words", None),
    ],
)
def test_model_ref_parsing(text: str, ref: ModelRef | None) -> None:
    assert parse_model_ref(text) == ref
