"""`homelab hw`'s verdict on the llama.cpp build against the GPUs and the driver.

No GPU or NVIDIA driver can exist on the machines these tests run on: the fake NVML of
test_gpu_detection stands in for them (here with chosen compute capabilities and driver
versions), and BuildInfo stands in for builds that cannot be made here. The report, its
verdict, the text and JSON renderings and the CLI are real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_gpu_detection import FakeGpu, FakeNvml

from homelab.hardware.build import CUDA_REBUILD_COMMAND, BuildInfo
from homelab.hardware.render import format_report
from homelab.hardware.report import detect
from homelab.llamacpp.cuda import BuildRecord

ROOT = Path(__file__).resolve().parents[2]


class DriverNvml(FakeNvml):
    """FakeNvml with a driver of the given CUDA version and GPUs of given capabilities."""

    def __init__(self, capabilities: list[tuple[int, int]], cuda_driver: int = 13000) -> None:
        super().__init__([FakeGpu(uuid=f"GPU-{i}") for i in range(len(capabilities))])
        self.capabilities = capabilities
        self.cuda_driver = cuda_driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_driver

    def nvmlDeviceGetCudaComputeCapability(self, gpu: FakeGpu) -> tuple[int, int]:
        return self.capabilities[int(gpu.uuid.split("-")[1])]


def cuda_build(archs: str = "890", version: str | None = "13.5", extra: str = "") -> BuildInfo:
    info = f"CUDA : ARCHS = {archs} | {extra}CPU : AVX2 = 1 |"
    return BuildInfo("0.3.36", True, info, ("CUDA", "CPU"), cuda_version=version)


CPU_BUILD = BuildInfo("0.3.36", False, "CPU : AVX2 = 1 |", ("CPU",))


def test_a_matching_build_says_it_runs_on_every_gpu() -> None:
    report = detect(DriverNvml([(8, 9)]), build=cuda_build(extra="NO_VMM = 1 | "))
    assert report.warnings == ()
    assert report.build_verdict == (
        "CUDA 13.5 build for sm_89: runs on every GPU here with driver CUDA 13.0"
    )
    text = format_report(report)
    assert "CUDA build      CUDA 13.5 · sm_89 · VMM pool: no (GGML_CUDA_NO_VMM)" in text
    assert "verdict         CUDA 13.5 build for sm_89: runs on every GPU" in text


def test_a_driver_older_than_the_builds_cuda_warns_with_both_fixes() -> None:
    report = detect(DriverNvml([(8, 9)], cuda_driver=12040), build=cuda_build())
    assert "does not match" in report.build_verdict
    (warning,) = report.warnings
    assert "supports CUDA 12.4, older than this build's CUDA 13.5" in warning
    assert "update the NVIDIA driver to 580 or newer" in warning
    assert CUDA_REBUILD_COMMAND in warning


def test_a_newer_minor_release_of_the_drivers_cuda_is_fine() -> None:
    """CUDA's minor-version compatibility: a 13.0 driver runs a 13.5 build."""
    assert detect(DriverNvml([(8, 9)], cuda_driver=13000), build=cuda_build()).warnings == ()


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ((8, 6), "older than every architecture this build has (sm_89)"),
        ((12, 0), "not among this build's architectures (sm_89): it runs only through JIT"),
    ],
)
def test_a_gpu_whose_architecture_the_build_lacks_warns(
    capability: tuple[int, int], expected: str
) -> None:
    report = detect(DriverNvml([(8, 9), capability]), build=cuda_build())
    (warning,) = report.warnings
    assert warning.startswith(f"GPU 1 (NVIDIA GeForce RTX 4090, sm_{capability[0]}")
    assert expected in warning and CUDA_REBUILD_COMMAND in warning


def test_a_build_for_every_architecture_of_a_mixed_box_matches() -> None:
    report = detect(DriverNvml([(8, 6), (8, 9)]), build=cuda_build("860,890"))
    assert report.warnings == ()
    assert report.build.cuda_architectures == (86, 89)
    assert report.build_verdict.startswith("CUDA 13.5 build for sm_86, sm_89: runs")


def test_a_cpu_only_build_on_a_gpu_box_says_why_make_built_it_so() -> None:
    record = BuildRecord(
        route="cpu-fallback",
        reason="driver 550.54.14 is too old for NVIDIA's CUDA 13 toolchain",
        fix="either update the NVIDIA driver to 580 or newer, or install a CUDA toolkit",
    )
    build = BuildInfo("0.3.36", False, "CPU : AVX2 = 1 |", ("CPU",), record=record)
    report = detect(DriverNvml([(8, 9)], cuda_driver=12040), build=build)
    assert report.build_verdict == "CPU-only build on a machine with an NVIDIA GPU"
    (warning,) = report.warnings
    assert "built for CPU only, but NVIDIA GeForce RTX 4090 is present" in warning
    assert "because driver 550.54.14 is too old" in warning
    assert "update the NVIDIA driver to 580" in warning and CUDA_REBUILD_COMMAND in warning


def test_without_a_gpu_no_build_is_a_mismatch() -> None:
    assert detect(DriverNvml([]), build=CPU_BUILD).build_verdict == (
        "CPU build; no NVIDIA GPU here"
    )
    report = detect(DriverNvml([]), build=cuda_build())
    assert report.warnings == ()
    assert report.build_verdict.endswith("no NVIDIA GPU here, so it runs on the CPU")


def test_the_json_report_carries_the_verdict_and_the_builds_cuda() -> None:
    document: dict[str, Any] = json.loads(
        json.dumps(detect(DriverNvml([(8, 6)]), build=cuda_build()).to_dict())
    )
    assert document["build"]["cuda_version"] == "13.5"
    assert "does not match" in document["build_verdict"]
    assert document["warnings"][0].startswith("GPU 0 (NVIDIA GeForce RTX 4090, sm_86)")


def test_homelab_hw_reports_the_record_make_wrote(tmp_path: Path) -> None:
    """The real CLI, with the real llama.cpp build of this machine and a record beside it."""
    record = tmp_path / "homelab-build.json"
    record.write_text(json.dumps({"name": "cpu", "reason": "no nvidia-smi: the CPU build"}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOMELAB_BUILD_RECORD": str(record)}
    done = subprocess.run(
        [sys.executable, "-m", "homelab.cli", "hw", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    document = json.loads(done.stdout)
    assert document["build"]["record"]["route"] == "cpu"
    assert document["build_verdict"]
