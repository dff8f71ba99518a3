"""``homelab pull``: verified, resumable downloads into the Hugging Face cache."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from fake_hub import FakeHub, sha256
from huggingface_hub import hf_hub_download, scan_cache_dir

from homelab.errors import HubError
from homelab.gguf.reader import read_model
from homelab.hub import cache
from homelab.hub.pull import pull, pull_by_name
from homelab.hub.quants import ModelRef


class FakeInterruptingProgress:
    """Presses Ctrl-C once a download has passed ``at_bytes`` (a user giving up mid-way)."""

    def __init__(self, at_bytes: int) -> None:
        self.at_bytes = at_bytes
        self.done = 0
        self.notes: list[str] = []

    def start(self, label: str, total_bytes: int, done_bytes: int) -> None:
        self.done = done_bytes

    def advance(self, n_bytes: int) -> None:
        self.done += n_bytes
        if self.done >= self.at_bytes:
            raise KeyboardInterrupt

    def note(self, message: str) -> None:
        self.notes.append(message)

    def finish(self) -> None:
        pass


class RecordingProgress(FakeInterruptingProgress):
    def __init__(self) -> None:
        super().__init__(at_bytes=2**62)


def _blob(hf_home: Path, repo: str, data: bytes) -> Path:
    return cache.blob_path(hf_home / "hub", repo, sha256(data))


def test_pull_verifies_and_lays_out_the_cache_like_huggingface_hub(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    pulled = pull(ModelRef(tiny_repo, "F16"))
    data = fake_hub.repos[tiny_repo].files["TinyLlama-F16.gguf"]
    assert pulled.path.read_bytes() == data and pulled.downloaded_bytes == len(data)
    assert pulled.path.is_symlink() and pulled.path.resolve() == _blob(hub_env, tiny_repo, data)
    assert (
        cache.repo_dir(hub_env / "hub", tiny_repo) / "refs" / "main"
    ).read_text() == pulled.commit
    # huggingface_hub itself finds the file offline, and its cache scan is clean
    found = hf_hub_download(
        tiny_repo, "TinyLlama-F16.gguf", cache_dir=hub_env / "hub", local_files_only=True
    )
    assert Path(found) == pulled.path
    report = scan_cache_dir(hub_env / "hub")
    assert not report.warnings and [r.repo_id for r in report.repos] == [tiny_repo]


def test_token_goes_to_the_hub_but_not_to_the_cdn(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    pull_by_name(f"{tiny_repo}:Q4_0")
    assert {r.authorization for r in fake_hub.requests("hub")} == {"Bearer hf_test_token"}
    assert {r.authorization for r in fake_hub.requests("cdn")} == {None}


def test_fake_hub_speaks_the_protocol_huggingface_hub_downloads_with(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    """The stand-in is only worth its tests if the real client downloads from it."""
    path = hf_hub_download(
        tiny_repo, "TinyLlama-Q4_0.gguf", cache_dir=hub_env / "hub", endpoint=fake_hub.endpoint
    )
    assert Path(path).read_bytes() == fake_hub.repos[tiny_repo].files["TinyLlama-Q4_0.gguf"]
    assert [r.method for r in fake_hub.requests("hub")] == ["HEAD"]


def test_split_set_lands_in_one_folder_and_loads(hub_env: Path, tiny_repo: str) -> None:
    pulled = pull(ModelRef(tiny_repo, "q8_0"))
    assert [p.name for p in pulled.paths] == [
        "TinyLlama-Q8_0-00001-of-00002.gguf",
        "TinyLlama-Q8_0-00002-of-00002.gguf",
    ]
    assert pulled.paths[0].parent == pulled.paths[1].parent
    model = read_model(pulled.path)
    assert model.n_files == 2 and model.file_type == "Q8_0"


def test_second_pull_reuses_the_verified_cache(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    pull(ModelRef(tiny_repo, "Q4_0"))
    fake_hub.clear_log()
    again = pull(ModelRef(tiny_repo, "Q4_0"))
    assert again.downloaded_bytes == 0 and fake_hub.requests("cdn") == []


def test_dropped_connection_resumes_with_a_range_request(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    data = fake_hub.repos[tiny_repo].files["TinyLlama-F16.gguf"]
    fake_hub.faults.cut_after_bytes[sha256(data)] = 2_000_000
    progress = RecordingProgress()
    pulled = pull(ModelRef(tiny_repo, "F16"), progress=progress, mmproj=False)  # its file only
    assert pulled.path.read_bytes() == data
    ranges = [r.range for r in fake_hub.requests("cdn", "GET")]
    assert ranges[0] is None and len(ranges) == 2
    assert ranges[1] == "bytes=2000000-"  # every byte received before the cut was kept
    assert any("resuming" in note for note in progress.notes)


def test_interrupted_pull_resumes_in_the_next_run(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    data = fake_hub.repos[tiny_repo].files["TinyLlama-F16.gguf"]
    with pytest.raises(KeyboardInterrupt):
        pull(ModelRef(tiny_repo, "F16"), progress=FakeInterruptingProgress(at_bytes=3_000_000))
    partial = _blob(hub_env, tiny_repo, data).with_name(sha256(data) + cache.PARTIAL_SUFFIX)
    kept = partial.stat().st_size
    assert 3_000_000 <= kept < len(data)
    fake_hub.clear_log()
    pulled = pull(ModelRef(tiny_repo, "F16"))
    assert pulled.downloaded_bytes == len(data) - kept
    # the rest of the model, then its projector (not started before the interruption)
    assert [r.range for r in fake_hub.requests("cdn", "GET")] == [f"bytes={kept}-", None]
    assert hashlib.sha256(pulled.path.read_bytes()).hexdigest() == sha256(data)
    assert not partial.exists()


def test_corrupted_download_is_refused_and_deleted(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    data = fake_hub.repos[tiny_repo].files["TinyLlama-Q4_0.gguf"]
    fake_hub.faults.corrupt.add(sha256(data))
    with pytest.raises(
        HubError, match=r"failed verification: sha256 is .* deleted and will not be used"
    ):
        pull(ModelRef(tiny_repo, "Q4_0"))
    blobs = cache.repo_dir(hub_env / "hub", tiny_repo) / "blobs"
    assert list(blobs.iterdir()) == []
    assert not (cache.repo_dir(hub_env / "hub", tiny_repo) / "snapshots").exists()


def test_damaged_cached_blob_is_downloaded_again(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    pulled = pull(ModelRef(tiny_repo, "Q4_0"))
    blob = pulled.path.resolve()
    blob.write_bytes(b"\0" * blob.stat().st_size)  # same size, new mtime: a damaged disk
    progress = RecordingProgress()
    again = pull(ModelRef(tiny_repo, "Q4_0"), progress=progress)
    assert again.path.read_bytes() == fake_hub.repos[tiny_repo].files["TinyLlama-Q4_0.gguf"]
    assert any("damaged" in note for note in progress.notes)


def test_truncated_download_is_refused(hub_env: Path, tiny_repo: str, fake_hub: FakeHub) -> None:
    data = fake_hub.repos[tiny_repo].files["TinyLlama-Q4_0.gguf"]
    fake_hub.faults.truncate_to[sha256(data)] = 1000  # every answer is short
    with pytest.raises(HubError, match=r"the server has 1000 bytes of it, the hub lists 1,7"):
        pull(ModelRef(tiny_repo, "Q4_0"))
    assert not list((cache.repo_dir(hub_env / "hub", tiny_repo) / "blobs").iterdir())


def test_a_server_that_cannot_resume_restarts_from_zero(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    data = fake_hub.repos[tiny_repo].files["TinyLlama-F16.gguf"]
    fake_hub.faults.cut_after_bytes[sha256(data)] = 1_000_000
    fake_hub.faults.ignore_range = True
    progress = RecordingProgress()
    pulled = pull(ModelRef(tiny_repo, "F16"), progress=progress)
    assert pulled.path.read_bytes() == data
    assert "the server cannot resume; starting over" in progress.notes


def test_offline_uses_the_cache_and_says_so_without_any_request(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    online = pull(ModelRef(tiny_repo, "Q4_0"))
    fake_hub.clear_log()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = pull(ModelRef(tiny_repo, "Q4_0"))
    assert offline.path == online.path and offline.from_cache_only
    assert "HF_HUB_OFFLINE" in offline.notes[0]
    started = time.monotonic()
    with pytest.raises(HubError, match=r"not in the local cache .* HF_HUB_OFFLINE"):
        pull(ModelRef(tiny_repo, "F16"))
    assert time.monotonic() - started < 5  # fails at once: no request, no retry loop
    assert fake_hub.requests() == []


def test_unreachable_hub_falls_back_to_the_cache(
    hub_env: Path, tiny_repo: str, silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pull(ModelRef(tiny_repo, "Q4_0"))
    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.3")
    pulled = pull(ModelRef(tiny_repo, "Q4_0"))
    assert pulled.from_cache_only and "unreachable" in pulled.notes[0]


def test_a_second_download_of_the_same_file_is_refused(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    from filelock import FileLock

    data = fake_hub.repos[tiny_repo].files["TinyLlama-Q4_0.gguf"]
    other_process = FileLock(cache.lock_path(hub_env / "hub", tiny_repo, sha256(data)))
    with other_process, pytest.raises(HubError, match=r"Another download of .* is running"):
        pull(ModelRef(tiny_repo, "Q4_0"))
    assert pull(ModelRef(tiny_repo, "Q4_0")).path.read_bytes() == data


def test_gated_repo_says_to_accept_the_license_and_set_a_token(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub
) -> None:
    fake_hub.faults.gated.add(tiny_repo)
    with pytest.raises(HubError, match=r"gated .*Accept its license.*HF_TOKEN"):
        pull(ModelRef(tiny_repo, "Q4_0"))


def test_small_git_files_are_checked_by_their_git_blob_id(tmp_path: Path) -> None:
    from fake_hub import git_blob_id

    from homelab.hub.progress import SilentProgress
    from homelab.hub.pull import verification_problem
    from homelab.hub.quants import RemoteFile

    path = tmp_path / "tokenizer.json"
    path.write_bytes(b'{"tiny": true}\n')
    good = RemoteFile("tokenizer.json", path.stat().st_size, None, git_blob_id(path.read_bytes()))
    assert verification_problem(path, good, SilentProgress()) is None
    bad = RemoteFile("tokenizer.json", good.size_bytes, None, "0" * 40)
    assert "git blob id is" in (verification_problem(path, bad, SilentProgress()) or "")


def test_pull_checks_free_disk_before_downloading(
    hub_env: Path, tiny_repo: str, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    # A fake full disk: filling the real one is not something a test may do.
    fake_disk_usage = lambda _: usage(1, 1, 1 << 20)  # noqa: E731
    monkeypatch.setattr("homelab.hub.pull.shutil.disk_usage", fake_disk_usage)
    with pytest.raises(HubError, match=r"Not enough free disk .*HF_HOME"):
        pull(ModelRef(tiny_repo, "Q4_0"))
    assert fake_hub.requests("cdn") == []


def test_pull_fetches_the_projector_the_repo_offers(hub_env: Path, tiny_repo: str) -> None:
    """The repo's mmproj lands beside the model (found there when the model loads), and
    ``mmproj=False`` leaves it out. (The hub is the fake hub: no network here.)"""
    bare = pull(ModelRef(tiny_repo, "Q4_0"), mmproj=False)
    assert bare.mmproj is None and not list(bare.path.parent.glob("mmproj*"))
    pulled = pull(ModelRef(tiny_repo, "F16"))
    assert pulled.mmproj is not None and pulled.mmproj.parent == pulled.path.parent
    assert pulled.mmproj.name == "mmproj-TinyLlama-F16.gguf"
    assert any("vision projector" in note for note in pulled.notes)


def test_a_vision_repo_pulled_by_name_plans_with_its_projector(
    hub_env: Path, fake_hub: FakeHub
) -> None:
    """A repo laid out as vision repos are (the model in a quant folder, unnamed projectors at
    the top): the pull fetches the F16 projector, and the model, run by name, finds it."""
    from homelab.gguf import demo_vision
    from homelab.models.launch import plan_file
    from homelab.models.ref import resolve

    projector = demo_vision.mmproj_path("qwen2vl")
    fake_hub.add_repo(
        "homelab-test/TinyVL-GGUF",
        {
            "F16/TinyVL-F16.gguf": demo_vision.text_model_path("qwen2vl"),
            "mmproj-F32.gguf": projector,
            "mmproj-F16.gguf": projector,
        },
    )
    pulled = pull(ModelRef("homelab-test/TinyVL-GGUF", "F16"))
    assert pulled.mmproj is not None and pulled.mmproj.name == "mmproj-F16.gguf"
    plan = plan_file(resolve("homelab-test/TinyVL-GGUF:F16"), verify=False)
    assert plan.projector is not None and plan.projector.path == str(pulled.mmproj)
    assert plan.settings.mmproj_path == str(pulled.mmproj)


def test_best_projector_prefers_the_models_name_then_f16() -> None:
    from homelab.hub.pull import best_projector
    from homelab.hub.quants import GgufEntry, RemoteFile

    def remote(path: str) -> RemoteFile:
        return RemoteFile(path, 1, "0" * 64, None)

    entry = GgufEntry("Q4_K_M", "gemma-3-4b-it", (remote("gemma-3-4b-it-Q4_K_M.gguf"),))
    unnamed = (remote("mmproj-F32.gguf"), remote("mmproj-BF16.gguf"), remote("mmproj-F16.gguf"))
    assert best_projector(unnamed, entry) == unnamed[2]
    named = (*unnamed, remote("mmproj-gemma-3-4b-it-f32.gguf"))
    assert best_projector(named, entry) == named[3]
    assert best_projector((), entry) is None
