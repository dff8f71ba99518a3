"""Plan before download: GGUF headers read remotely through bounded range requests."""

from __future__ import annotations

import dataclasses
import struct
import time
from pathlib import Path

import pytest
from fake_hub import FakeHub

from homelab.errors import HubError, ModelFileError
from homelab.gguf.reader import read_model
from homelab.hub.client import HubUnavailableError, file_url, repo_listing
from homelab.hub.pull import pull
from homelab.hub.quants import ModelRef, select_entry
from homelab.hub.remote import RangeReader, read_remote_header, remote_model
from homelab.hub.resolve import resolve_hub_model
from homelab.hub.settings import hub_settings

EVIL_REPO = "evil/Broken-GGUF"


@pytest.fixture
def remote_bytes(fake_hub: FakeHub):  # type: ignore[no-untyped-def]
    return lambda repo, path: fake_hub.repos[repo].files[path]


def test_remote_header_model_equals_the_downloaded_files_model(
    hub_env: Path, tiny_repo: str
) -> None:
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    for quant in ("F16", "Q8_0", "Q4_0"):  # Q8_0 is a two-part split set
        remote = remote_model(settings, listing, select_entry(tiny_repo, listing.entries, quant))
        local = read_model(pull(ModelRef(tiny_repo, quant), settings=settings).path)
        first_path = next(e.first_path for e in listing.entries if e.quant == quant)
        assert remote.source == f"hf://{tiny_repo}/{first_path}"
        assert dataclasses.replace(remote, source=local.source) == local
        assert remote.file_type == quant


def test_remote_plan_reads_only_the_header(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    entry = select_entry(tiny_repo, listing.entries, "F16")
    fake_hub.clear_log()
    remote_model(settings, listing, entry)
    ranges = [r.range for r in fake_hub.requests("cdn")]
    assert ranges and all(r and r.startswith("bytes=") for r in ranges)
    fetched = sum(
        int(r.split("-")[1]) - int(r.split("=")[1].split("-")[0]) + 1 for r in ranges if r
    )
    assert fetched < entry.total_bytes / 4  # the header, not the 5.8 MB of weights


def test_range_reader_grows_its_chunks(hub_env: Path, tiny_repo: str, remote_bytes) -> None:  # type: ignore[no-untyped-def]
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    remote = select_entry(tiny_repo, listing.entries, "F16").files[0]
    reader = RangeReader(
        settings,
        file_url(settings, tiny_repo, listing.commit, remote.path),
        label="t",
        file_bytes=remote.size_bytes,
        first_chunk_bytes=1024,
    )
    data = b"".join(reader.read(100) for _ in range(200))  # 20,000 bytes in small reads
    assert data == remote_bytes(tiny_repo, remote.path)[:20_000]
    assert reader.requests == 5  # 1, 2, 4, 8 and 16 KiB
    assert reader.fetched_bytes == 1024 * (1 + 2 + 4 + 8 + 16)


def test_resolve_repo_quant_uses_remote_headers_then_the_cache(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    with pytest.raises(HubError, match="several GGUF files"):
        resolve_hub_model(tiny_repo)  # no quant and nothing downloaded: which one?
    remote = resolve_hub_model(f"{tiny_repo}:Q4_0")
    assert remote.source.startswith("hf://")
    pull(ModelRef(tiny_repo, "Q4_0"))
    fake_hub.clear_log()
    local = resolve_hub_model(tiny_repo, quant="q4_0")
    assert not local.source.startswith("hf://") and fake_hub.requests() == []
    assert resolve_hub_model(tiny_repo) == local  # the one downloaded quant is the default


# ---- malicious and broken remote data ---------------------------------------------------


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _evil_repo(fake_hub: FakeHub, quant_files: dict[str, Path]) -> None:
    real = quant_files["F16"].read_bytes()
    fake_hub.add_repo(
        EVIL_REPO,
        {
            "Tensors-Q4_0.gguf": _header(2**60, 0) + b"\0" * 64,
            "String-Q5_0.gguf": _header(1, 1) + struct.pack("<Q", 2**40) + b"\0" * 64,
            "Header-Q6_K.gguf": real[:5000],  # cut inside the header
            "Data-Q8_0.gguf": real[:200_000],  # whole header, most tensor data missing
        },
    )


@pytest.mark.parametrize(
    ("quant", "problem"),
    [
        ("Q4_0", "claims 1,152,921,504,606,846,976 tensors"),
        ("Q5_0", "string of 1,099,511,627,776 bytes"),
        ("Q6_K", "truncated"),
        ("Q8_0", "truncated: tensor"),
    ],
)
def test_malicious_or_broken_headers_fail_fast_and_small(
    hub_env: Path, fake_hub: FakeHub, quant_files: dict[str, Path], quant: str, problem: str
) -> None:
    _evil_repo(fake_hub, quant_files)
    settings = hub_settings()
    listing = repo_listing(settings, EVIL_REPO)
    entry = select_entry(EVIL_REPO, listing.entries, quant)
    started = time.monotonic()
    with pytest.raises(ModelFileError, match=problem):
        remote_model(settings, listing, entry)
    assert time.monotonic() - started < 5
    assert len(fake_hub.requests("cdn")) <= 2


def test_a_header_larger_than_the_cap_is_refused(hub_env: Path, tiny_repo: str) -> None:
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    remote = select_entry(tiny_repo, listing.entries, "F16").files[0]
    with pytest.raises(ModelFileError, match="needs more than"):
        read_remote_header(settings, listing, remote, first_chunk_bytes=256, max_fetched_bytes=4096)


def test_missing_file_is_a_clear_404(hub_env: Path, tiny_repo: str, fake_hub: FakeHub) -> None:
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    entry = select_entry(tiny_repo, listing.entries, "F16")
    del fake_hub.repos[tiny_repo].files["TinyLlama-F16.gguf"]  # listed, then deleted on the hub
    with pytest.raises(HubError, match=r"does not exist in the repo \(404\)"):
        remote_model(settings, listing, entry)


def test_unknown_repo_is_a_clear_error(hub_env: Path, fake_hub: FakeHub) -> None:
    with pytest.raises(HubError, match=r"repository not found \(404\).*HF_TOKEN"):
        repo_listing(hub_settings(), "nobody/Nothing-GGUF")


def test_stalled_cdn_times_out(
    hub_env: Path,
    tiny_repo: str,
    fake_hub: FakeHub,
    silent_server: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.5")
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    fake_hub.faults.cdn_url = silent_server
    started = time.monotonic()
    with pytest.raises(HubUnavailableError, match=r"Timed out .* within 0.5 s"):
        remote_model(settings, listing, select_entry(tiny_repo, listing.entries, "Q4_0"))
    assert time.monotonic() - started < 5


def test_stalled_hub_api_times_out(
    hub_env: Path, silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.5")
    started = time.monotonic()
    with pytest.raises(HubUnavailableError, match="Timed out"):
        repo_listing(hub_settings(), "org/model")
    assert time.monotonic() - started < 5


def test_server_ignoring_ranges_still_gives_the_header_without_the_whole_file(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    fake_hub.faults.ignore_range = True
    settings = hub_settings()
    listing = repo_listing(settings, tiny_repo)
    model = remote_model(settings, listing, select_entry(tiny_repo, listing.entries, "F16"))
    assert model.file_type == "F16"


def test_a_hub_cannot_make_homelab_write_outside_the_cache(
    hub_env: Path, fake_hub: FakeHub, quant_files: dict[str, Path]
) -> None:
    data = quant_files["Q4_0"].read_bytes()
    fake_hub.add_repo("evil/Escape-GGUF", {"../../escape-Q4_0.gguf": data, "ok-Q4_0.gguf": data})
    listing = repo_listing(hub_settings(), "evil/Escape-GGUF")
    assert [f.path for e in listing.entries for f in e.files] == ["ok-Q4_0.gguf"]
    fake_hub.repos["evil/Escape-GGUF"].commit = "../../../tmp/x"
    with pytest.raises(HubError, match="which commit"):
        repo_listing(hub_settings(), "evil/Escape-GGUF")
