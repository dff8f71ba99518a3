"""Plan before download: quant x KV type matrix from remote headers, and the planner's REPO hook."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fake_hub import FakeHub

from homelab.cli import main
from homelab.gguf.reader import read_model
from homelab.hub.client import repo_listing
from homelab.hub.fit import fits_on_this_machine
from homelab.hub.matrix import best_entry, build_matrix, render_matrix
from homelab.hub.pull import pull
from homelab.hub.quants import ModelRef, select_entry
from homelab.hub.remote import remote_model
from homelab.hub.settings import hub_settings
from homelab.planner.budget import Device, Hardware, host_device
from homelab.planner.plan import plan_model
from homelab.planner.search import PlanRequest

MIB = 1 << 20


def fake_gpu_hardware(vram_mib: int, ram_mib: int = 8192) -> Hardware:
    """A GPU of ``vram_mib`` (no GPU here: the planner is pure arithmetic over its budget)."""
    gpu = Device(
        "CUDA0", "gpu", f"FakeGPU {vram_mib} MiB", vram_mib * MIB, vram_mib * MIB, 500.0, 0, "test"
    )
    return Hardware((host_device(ram_mib * MIB, "test"), gpu), "vram", True)


def test_matrix_rows_per_quant_and_kv_type(hub_env: Path, tiny_repo: str) -> None:
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    matrix = build_matrix(settings, listing, fake_gpu_hardware(12))
    rows = {row.quant: row for row in matrix.rows}
    assert list(rows) == ["F16", "Q8_0", "Q4_0"]
    assert rows["F16"].placement == "2/5 layers on GPU"  # 5.5 MiB of weights do not all fit
    assert rows["Q8_0"].placement == rows["Q4_0"].placement == "all on GPU"
    assert matrix.best is rows["Q8_0"]  # the best quant with every layer on the GPU
    q8 = {cell.kv: cell for cell in rows["Q8_0"].cells}
    assert q8["f16/f16"].max_ctx < q8["q8_0/q8_0"].max_ctx < q8["q4_0/q4_0"].max_ctx
    assert all(cell.decode_tok_s and cell.decode_tok_s > 0 for cell in q8.values())
    text = render_matrix(matrix)
    assert "*Q8_0" in text and f"homelab pull {tiny_repo}:Q8_0" in text
    assert best_entry(settings, listing, fake_gpu_hardware(12)).quant == "Q8_0"


def test_remote_plan_equals_the_plan_of_the_downloaded_file(hub_env: Path, tiny_repo: str) -> None:
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    hardware = fake_gpu_hardware(12)
    for quant in ("F16", "Q8_0"):
        remote = remote_model(settings, listing, select_entry(tiny_repo, listing.entries, quant))
        local = read_model(pull(ModelRef(tiny_repo, quant)).path)
        remote_plan = plan_model(remote, hardware, PlanRequest(), verify=False)
        local_plan = plan_model(local, hardware, PlanRequest(), verify=False)
        assert remote_plan.settings == local_plan.settings
        assert remote_plan.memory == local_plan.memory
        assert remote_plan.capacity == local_plan.capacity
        assert remote_plan.predicted == local_plan.predicted


def test_a_row_whose_header_is_broken_is_reported_not_fatal(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    repo = fake_hub.repos[tiny_repo]
    repo.files["TinyLlama-Q4_0.gguf"] = repo.files["TinyLlama-Q4_0.gguf"][:3000]
    settings = hub_settings()
    matrix = build_matrix(settings, repo_listing(settings, tiny_repo), fake_gpu_hardware(12))
    broken = next(row for row in matrix.rows if row.quant == "Q4_0")
    assert broken.placement == "unreadable" and "truncated" in (broken.problem or "")
    assert matrix.best is not None and matrix.best.quant == "Q8_0"


def test_search_plan_json_for_this_machine(
    hub_env: Path, tiny_repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["search", tiny_repo, "--plan", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [row["quant"] for row in document["rows"]] == ["F16", "Q8_0", "Q4_0"]
    assert sum(row["best"] for row in document["rows"]) == 1
    assert {c["kv"] for c in document["rows"][0]["cells"]} == {"f16/f16", "q8_0/q8_0", "q4_0/q4_0"}


def test_plan_accepts_repo_and_repo_quant(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", tiny_repo, "--no-verify", "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert set(every["model"]["quants_considered"]) == {"F16", "Q8_0", "Q4_0"}
    assert main(["plan", f"{tiny_repo}:Q4_0", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["model"]["quant"] == "Q4_0" and one["model"]["source"].startswith("hf://")
    assert not any(r.path.startswith("/cdn") and r.range is None for r in fake_hub.requests("cdn"))


def test_pull_without_quant_takes_the_planners_pick(
    hub_env: Path, tiny_repo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pull", tiny_repo, "--json"]) == 0
    captured = capsys.readouterr()
    pulled = json.loads(captured.out)
    assert f"no quant given; {pulled['quant']}" in captured.err


def test_fit_offers_local_quantization_when_a_high_precision_file_does_not_fit(
    quant_files: dict[str, Path],
) -> None:
    host = replace(host_device(8192 * MIB, "test"), budget_bytes=11 * MIB)  # Q4_0 fits, F16 not
    small_host = Hardware((host,), "cpu", True)
    f16, q4 = (read_model(quant_files[q]) for q in ("F16", "Q4_0"))
    fit_f16, fit_q4 = fits_on_this_machine([f16, q4], small_host)
    assert fit_f16 is not None and not fit_f16.fits
    assert fit_f16.quantize_command == f"homelab quantize {f16.source} --to Q4_K_M"
    assert fit_f16.summary.endswith(fit_f16.quantize_command) and "Nothing fits" in fit_f16.detail
    assert fit_q4 is not None and fit_q4.fits and fit_q4.quantize_command is None
    assert fit_q4.summary.startswith("CPU · ")


def test_offline_plan_of_a_repo_uses_the_downloaded_quants(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from homelab.hub.resolve import hub_variants

    for quant in ("Q8_0", "Q4_0"):
        pull(ModelRef(tiny_repo, quant))
    fake_hub.clear_log()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    variants = hub_variants(tiny_repo)
    assert variants is not None and sorted(m.file_type for m in variants) == ["Q4_0", "Q8_0"]
    assert hub_variants("not-a-repo.gguf") is None
    assert fake_hub.requests() == []


def test_offline_plan_of_a_catalogued_repo_falls_back_to_the_catalogue(
    hub_env: Path,
    fake_hub: FakeHub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["plan", "bartowski/Qwen_Qwen3-8B-GGUF", "--vram", "24GiB", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["model"]["architecture"] == "qwen3" and document["fits"]
    assert main(["plan", "nobody/Unknown-GGUF", "--json"]) == 1
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err
    assert fake_hub.requests() == []
