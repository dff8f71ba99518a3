"""profiles/gpus.toml: the GPUs the planner knows for `--gpu ID`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from homelab.errors import ConfigError
from homelab.hardware.profiles import find_gpu_profile, gpu_profiles_path, load_gpu_profiles

GIB = 1 << 30
MIB = 1 << 20
REQUIRED_IDS = {
    "rtx-3060-12gb", "rtx-3060-ti", "rtx-3070", "rtx-3080-10gb", "rtx-3080-12gb", "rtx-3090",
    "rtx-3090-ti", "rtx-4060-ti-16gb", "rtx-4070", "rtx-4070-ti-super", "rtx-4080",
    "rtx-4080-super", "rtx-4090", "rtx-5070-ti", "rtx-5080", "rtx-5090", "rtx-a4000",
    "rtx-a5000", "rtx-a6000", "rtx-6000-ada", "l4", "l40s", "a100-40gb", "a100-80gb-pcie",
    "a100-80gb-sxm", "h100-pcie", "h100-sxm", "h200",
}  # fmt: skip


def test_the_bundled_file_loads_with_the_expected_gpus() -> None:
    profiles = load_gpu_profiles()
    assert gpu_profiles_path().name == "gpus.toml"
    assert len(profiles) >= 20
    assert set(profiles) >= REQUIRED_IDS


def test_every_profile_is_sane() -> None:
    for key, profile in load_gpu_profiles().items():
        assert profile.id == key and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", key)
        assert profile.vram_bytes > GIB and profile.vram_bytes % GIB == 0, key
        assert 100 < profile.bandwidth_gb_s < 10_000, key
        assert re.fullmatch(r"\d{1,2}\.\d", profile.compute_capability), key
        assert 0 < profile.fp16_tflops < 2_000, key
        assert 256 * MIB <= profile.overhead_bytes <= 2 * GIB, key
        assert profile.source and profile.name and profile.nvml_names, key


def test_known_figures() -> None:
    rtx_4090 = load_gpu_profiles()["rtx-4090"]
    assert rtx_4090.vram_bytes == 25769803776
    assert rtx_4090.bandwidth_gb_s == 1008 and rtx_4090.compute_capability == "8.9"
    assert load_gpu_profiles()["h200"].compute_capability == "9.0"


@pytest.mark.parametrize("query", ["rtx-4090", "RTX 4090", "NVIDIA GeForce RTX 4090", "rtx4090"])
def test_find_by_id_product_name_or_nvml_name(query: str) -> None:
    assert find_gpu_profile(query).id == "rtx-4090"


def test_every_nvml_name_finds_its_own_profile_given_its_vram() -> None:
    for profile in load_gpu_profiles().values():
        for nvml_name in profile.nvml_names:
            nvml_total_bytes = profile.vram_bytes - 400 * MIB  # NVML reports a little less
            assert find_gpu_profile(nvml_name, vram_bytes=nvml_total_bytes) == profile


def test_a_name_sold_with_two_capacities_needs_the_vram() -> None:
    with pytest.raises(ConfigError, match="rtx-3080-10gb, rtx-3080-12gb"):
        find_gpu_profile("NVIDIA GeForce RTX 3080")
    assert find_gpu_profile("RTX 3080", vram_bytes=10 * GIB).id == "rtx-3080-10gb"
    assert find_gpu_profile("RTX 3080", vram_bytes=12 * GIB).id == "rtx-3080-12gb"


def test_unknown_gpu_lists_the_known_ids() -> None:
    with pytest.raises(ConfigError) as caught:
        find_gpu_profile("Radeon RX 7900 XTX")
    message = str(caught.value)
    assert "gpus.toml" in message and "rtx-4090" in message and "h200" in message


def test_a_known_name_with_the_wrong_vram_is_not_matched() -> None:
    with pytest.raises(ConfigError, match=r"8\.0 GiB"):
        find_gpu_profile("NVIDIA GeForce RTX 4060 Ti", vram_bytes=8 * GIB)  # the 8 GB model


def test_an_invalid_file_names_itself_and_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "gpus.toml"
    path.write_text('[my-gpu]\nname = "My GPU"\nvram_bytes = 1024\n')
    with pytest.raises(ConfigError, match=r"gpus\.toml: \[my-gpu\] lacks the field"):
        load_gpu_profiles(path)
    path.write_text(
        '[my-gpu]\nname = "My GPU"\nvram_bytes = -1\nbandwidth_gb_s = 100\n'
        'compute_capability = "8.9"\nfp16_tflops = 1.0\noverhead_bytes = 1\nsource = "me"\n'
    )
    with pytest.raises(ConfigError, match="must be positive"):
        load_gpu_profiles(path)
    path.write_text("[broken")
    with pytest.raises(ConfigError, match="cannot read GPU profiles"):
        load_gpu_profiles(path)
