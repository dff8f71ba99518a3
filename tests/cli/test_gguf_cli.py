"""``homelab demo-model`` and ``homelab inspect``, driven through the real entry point."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from homelab import cli
from homelab.cli import demo_model as demo_cli
from homelab.gguf import demo, generator
from homelab.gguf.demo import demo_model_path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- demo-model --------------------------------------------------------------------------


def test_demo_model_json_describes_the_cached_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "demo-model", "--arch", "qwen3", "--json")
    assert code == 0
    document = json.loads(out)
    cached = demo_model_path("qwen3")
    assert document == {
        "path": str(cached),
        "arch": "qwen3",
        "size": "tiny",
        "quant": "F16",
        "bytes": cached.stat().st_size,
        "n_params": document["n_params"],
        "random_weights": True,
    }
    assert 2_000_000 < document["n_params"] < 4_000_000
    assert Path(document["path"]).parent == Path(os.environ["HOMELAB_DEMO_CACHE"])
    assert "RANDOM WEIGHTS" in err


def test_demo_model_writes_to_a_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "mine.gguf"
    code, out, _ = run_cli(capsys, "demo-model", "--arch", "mamba", "--quant", "q8_0", str(target))
    assert code == 0
    assert target.read_bytes() == demo_model_path("mamba", quant="Q8_0").read_bytes()
    assert str(target) in out
    assert "RANDOM WEIGHTS" in out
    assert not list(tmp_path.glob("*.partial"))


def test_demo_model_into_a_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "new-folder"
    code, _, _ = run_cli(capsys, "demo-model", "--json", f"{folder}/")
    assert code == 0
    assert (folder / demo_model_path("llama").name).is_file()


def test_demo_model_does_not_overwrite_without_force(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "precious.gguf"
    target.write_bytes(b"my real model")
    code, _, err = run_cli(capsys, "demo-model", str(target))
    assert code == 1
    assert "already exists" in err and "--force" in err
    assert target.read_bytes() == b"my real model"
    assert run_cli(capsys, "demo-model", "--force", str(target))[0] == 0
    assert target.read_bytes() == demo_model_path("llama").read_bytes()


def test_demo_model_rejects_an_unknown_architecture(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["demo-model", "--arch", "gpt5"])
    assert caught.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_cli_choices_match_the_generator() -> None:
    assert demo_cli.ARCH_CHOICES == generator.ARCHS
    assert demo_cli.SIZE_CHOICES == generator.SIZES
    assert demo_cli.QUANT_CHOICES == demo.QUANTS


def test_cli_modules_import_nothing_heavy() -> None:
    code = (
        "import sys, homelab.cli, homelab.cli.demo_model, homelab.cli.inspect\n"
        "heavy = {'numpy', 'gguf', 'llama_cpp'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- inspect -----------------------------------------------------------------------------


def inspect_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, object]:
    code, out, _ = run_cli(capsys, "inspect", "--json", str(path))
    assert code == 0
    result: dict[str, object] = json.loads(out)
    return result


def test_inspect_json_for_a_dense_model(capsys: pytest.CaptureFixture[str]) -> None:
    summary = inspect_json(capsys, demo_model_path("llama", quant="Q4_K_M"))
    assert summary["architecture"] == "llama"
    assert summary["quant"] == "Q4_K_M"
    assert (summary["n_layer"], summary["n_head"], summary["n_head_kv"]) == (4, 4, 2)
    assert (summary["head_dim_k"], summary["head_dim_v"]) == (64, 64)
    assert summary["n_vocab"] == 1024 and summary["context_length"] == 8192
    assert summary["chat_template"] is True
    assert summary["swa"] is None and summary["mla"] is None
    assert summary["experts"] is None and summary["recurrent"] is None
    tensor_types = summary["tensor_types"]
    assert isinstance(tensor_types, dict) and "Q4_K" in tensor_types
    assert sum(tensor_types.values()) == summary["tensor_count"] == 39


def test_inspect_reports_swa_mla_experts_and_recurrence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert inspect_json(capsys, demo_model_path("gemma3"))["swa"] == {"window": 128, "n_layers": 5}
    deepseek = inspect_json(capsys, demo_model_path("deepseek2"))
    assert deepseek["mla"] == {"kv_lora_rank": 64, "rope_dim": 32}
    assert deepseek["experts"] == {"n": 4, "used": 2, "shared": 1}
    mamba = inspect_json(capsys, demo_model_path("mamba"))
    assert mamba["recurrent"] == {"n_layers": 4, "d_conv": 4, "d_inner": 512, "d_state": 16}


def test_inspect_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "inspect", str(demo_model_path("deepseek2")))
    assert code == 0
    rows = [re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines()]
    lines = {row[0]: row[1] for row in rows if len(row) == 2}
    assert lines["MLA"].startswith("KV LoRA rank 64")
    assert lines["experts"] == "4 routed (2 used), 1 shared"
    assert lines["chat template"] == "yes (tool calls: hermes)"  # the detected format
    assert "parameters" in lines and "tensors" in lines


def test_inspect_can_list_tensors(capsys: pytest.CaptureFixture[str]) -> None:
    summary = inspect_json_with_tensors(capsys, demo_model_path("llama"))
    tensors = summary["tensors"]
    assert isinstance(tensors, list) and len(tensors) == 39
    assert tensors[0] == {
        "name": "token_embd.weight",
        "type": "F16",
        "shape": [256, 1024],
        "bytes": 256 * 1024 * 2,
    }


def inspect_json_with_tensors(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, object]:
    code, out, _ = run_cli(capsys, "inspect", "--json", "--tensors", str(path))
    assert code == 0
    result: dict[str, object] = json.loads(out)
    return result


def test_inspect_a_broken_file_fails_cleanly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(demo_model_path("llama").read_bytes()[:5000])
    code, out, err = run_cli(capsys, "inspect", "--json", str(broken))
    assert code == 1 and out == ""
    error = json.loads(err)["error"]
    assert error["type"] == "ModelFileError"
    assert str(broken) in error["message"] and "truncated" in error["message"]
