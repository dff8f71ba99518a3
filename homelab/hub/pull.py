"""Download a GGUF (or every part of a split set) into the Hugging Face cache, verified.

Each file goes to ``blobs/<sha256>.homelab-partial`` first. A dropped connection is resumed
with a range request from the bytes already on disk — within this run (a few retries while
the download makes progress) and across runs (the partial file stays after Ctrl-C or a
crash). Only a file whose sha256 equals the hub's LFS sha256 becomes a blob and is linked
into the snapshot; a file that fails is deleted and the pull fails with a clear error.

A repo that offers vision projectors (``mmproj*.gguf``, listed apart) gets its best one
fetched beside the model (:func:`best_projector`: named after the model, then F16 over BF16,
Q8_0, other quants and F32), so the model finds it next to itself when it loads.

With ``HF_HUB_OFFLINE=1`` nothing is fetched: a cached copy is used (and the caller is told),
or the pull fails at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2
from filelock import FileLock, Timeout

from homelab.errors import HubError
from homelab.hub import cache
from homelab.hub.client import (
    HubUnavailableError,
    RepoListing,
    file_url,
    open_range,
    repo_listing,
)
from homelab.hub.progress import ProgressSink, SilentProgress
from homelab.hub.quants import (
    GgufEntry,
    ModelRef,
    RemoteFile,
    best_projector,
    group_entries,
    parse_model_ref,
    select_entry,
)
from homelab.hub.settings import HubSettings, hub_settings
from homelab.locations import data_dir
from homelab.units import format_gib

HASH_CHUNK_BYTES = 8 << 20
MAX_STALLED_RETRIES = 4  # retries in a row that bring no new byte
RETRY_WAITS_S = (0.5, 1.0, 2.0, 4.0, 8.0)
DISK_MARGIN_BYTES = 256 << 20


@dataclass(frozen=True)
class PulledModel:
    """What a pull left on disk."""

    repo_id: str
    commit: str
    quant: str
    paths: tuple[Path, ...]  # snapshot paths, in part order; paths[0] is what to load
    total_bytes: int
    downloaded_bytes: int  # fetched by this call (0 when everything was cached)
    from_cache_only: bool  # offline or hub unreachable: the cached copy was used as is
    notes: tuple[str, ...]  # things the user should be told
    mmproj: Path | None = None  # the vision projector fetched with it, if the repo has one

    @property
    def path(self) -> Path:
        return self.paths[0]


@dataclass(frozen=True)
class CachedEntry:
    commit: str
    entry: GgufEntry
    paths: tuple[Path, ...]


def pull(
    ref: ModelRef,
    *,
    settings: HubSettings | None = None,
    progress: ProgressSink | None = None,
    mmproj: bool = True,
) -> PulledModel:
    """Make ``ref`` available locally (with the repo's projector unless ``mmproj`` is
    False); see the module docstring."""
    settings = settings or hub_settings()
    sink = progress or SilentProgress()
    if settings.offline:
        return _from_cache(settings, ref, "HF_HUB_OFFLINE is set")
    try:
        listing = repo_listing(settings, ref.repo_id)
    except HubUnavailableError as error:
        if find_cached(settings, ref) is None:
            raise
        return _from_cache(settings, ref, f"the hub is unreachable ({error.message})")
    entry = choose_entry(listing, ref.selector)
    fetched = [_fetch(settings, listing, remote, sink) for remote in entry.files]
    projector = best_projector(listing.projectors, entry) if mmproj else None
    projector_path = _fetch(settings, listing, projector, sink)[0] if projector else None
    cache.write_ref(settings.cache_dir, listing.repo_id, listing.commit)
    notes = (f"with its vision projector {projector.path}",) if projector else ()
    return PulledModel(
        listing.repo_id,
        listing.commit,
        entry.quant,
        tuple(p for p, _ in fetched),
        entry.total_bytes,
        sum(n for _, n in fetched),
        False,
        notes,
        projector_path,
    )


def pull_by_name(name: str, *, progress: ProgressSink | None = None) -> PulledModel:
    """``pull`` for ``ORG/NAME:QUANT`` as typed (the TUI's picker pulls through this)."""
    ref = parse_model_ref(name)
    if ref is None:
        raise HubError(f"{name!r} is not a hub repo name.", hint="Use ORG/NAME:QUANT.")
    return pull(ref, progress=progress)


def choose_entry(listing: RepoListing, selector: str | None) -> GgufEntry:
    if selector:
        return select_entry(listing.repo_id, listing.entries, selector)
    if len(listing.entries) == 1:
        return select_entry(listing.repo_id, listing.entries, listing.entries[0].label)
    if not listing.entries:
        raise HubError(
            f"{listing.repo_id} has no GGUF model files.",
            hint="homelab runs GGUF files; search for a GGUF repo with `homelab search`.",
        )
    quants = ", ".join(e.label for e in listing.entries)
    raise HubError(
        f"{listing.repo_id} has several GGUF files ({quants}); say which one.",
        hint=f"e.g. `homelab pull {listing.repo_id}:{listing.entries[-1].label}`; "
        f"`homelab search {listing.repo_id} --plan` shows which fit this machine.",
    )


# ---- the cached copy ----------------------------------------------------------------------


def cached_entries(settings: HubSettings, repo_id: str) -> list[CachedEntry]:
    """Complete cached entries of a repo by commit, the ``main`` commit's first."""
    by_commit: dict[str, list[cache.CachedFile]] = {}
    for found in cache.cached_files(settings.cache_dir, repo_id):
        by_commit.setdefault(found.commit, []).append(found)
    result = []
    for commit, files in by_commit.items():
        local = {f.path: f.local_path for f in files}
        remote = [RemoteFile(path, p.stat().st_size, None, None) for path, p in local.items()]
        for entry in group_entries(remote):
            if not entry.missing_parts:
                result.append(CachedEntry(commit, entry, tuple(local[f.path] for f in entry.files)))
    return result


def find_cached(settings: HubSettings, ref: ModelRef) -> CachedEntry | None:
    """The newest complete cached entry ``ref`` names (the ``main`` commit's first)."""
    found = cached_entries(settings, ref.repo_id)
    for commit in dict.fromkeys(c.commit for c in found):
        in_commit = {c.entry: c for c in found if c.commit == commit}
        chosen = _pick_cached(ref, tuple(in_commit))
        if chosen is not None:
            return in_commit[chosen]
    return None


def _pick_cached(ref: ModelRef, entries: tuple[GgufEntry, ...]) -> GgufEntry | None:
    if ref.selector is None:
        return entries[0] if len(entries) == 1 else None
    try:
        return select_entry(ref.repo_id, entries, ref.selector)
    except HubError:
        return None


def _from_cache(settings: HubSettings, ref: ModelRef, why: str) -> PulledModel:
    cached = find_cached(settings, ref)
    if cached is None:
        raise HubError(
            f"{ref} is not in the local cache ({settings.cache_dir}) and {why}, "
            "so it cannot be downloaded now.",
            hint="Connect and unset HF_HUB_OFFLINE, or pick a downloaded model (`homelab models`).",
        )
    note = (
        f"{why}: using the cached copy of {ref} (commit {cached.commit[:12]}) "
        "without checking for updates."
    )
    return PulledModel(
        ref.repo_id,
        cached.commit,
        cached.entry.quant,
        cached.paths,
        cached.entry.total_bytes,
        0,
        True,
        (note,),
    )


# ---- one file -----------------------------------------------------------------------------


def _fetch(
    settings: HubSettings, listing: RepoListing, remote: RemoteFile, sink: ProgressSink
) -> tuple[Path, int]:
    """The snapshot path of ``remote``, downloading and verifying it if needed; bytes fetched."""
    name = cache.blob_name(remote)
    if name is None:
        raise HubError(
            f"The hub gave no checksum for {listing.repo_id}/{remote.path}; "
            "homelab will not use a file it cannot verify."
        )
    blob = cache.blob_path(settings.cache_dir, listing.repo_id, name)
    pointer = cache.snapshot_path(settings.cache_dir, listing.repo_id, listing.commit, remote.path)
    try:  # the lock huggingface_hub takes for this blob too: one download at a time
        with FileLock(cache.lock_path(settings.cache_dir, listing.repo_id, name), timeout=0):
            fetched = 0
            if not (blob.is_file() and _cached_blob_ok(blob, remote, sink)):
                fetched = _download_verified(settings, listing, remote, blob, sink)
            cache.link_snapshot(blob, pointer)
    except Timeout:
        raise HubError(
            f"Another download of {listing.repo_id}/{remote.path} is running.",
            hint="Wait for it to finish, then run the pull again.",
        ) from None
    return pointer, fetched


def _cached_blob_ok(blob: Path, remote: RemoteFile, sink: ProgressSink) -> bool:
    """A blob already in the cache is used if it verifies (once; the result is remembered)."""
    if _recorded_verified(blob):
        return True
    problem = verification_problem(blob, remote, sink)
    if problem is None:
        _record_verified(blob)
        return True
    sink.note(f"cached {remote.path} is damaged ({problem}); downloading it again")
    blob.unlink()
    return False


def _download_verified(
    settings: HubSettings, listing: RepoListing, remote: RemoteFile, blob: Path, sink: ProgressSink
) -> int:
    partial = blob.with_name(blob.name + cache.PARTIAL_SUFFIX)
    partial.parent.mkdir(parents=True, exist_ok=True)
    url = file_url(settings, listing.repo_id, listing.commit, remote.path)
    digest = RunningDigest(remote)
    fetched = _download(settings, url, partial, digest, sink)
    digest.catch_up(partial, None)
    problem = digest.problem(_size(partial))
    if problem is not None:
        partial.unlink(missing_ok=True)
        raise HubError(
            f"{listing.repo_id}/{remote.path} failed verification: {problem}. "
            "The downloaded file was deleted and will not be used.",
            hint="Run the pull again; if it fails again the hub's copy or a proxy "
            "is corrupting it.",
        )
    os.replace(partial, blob)
    _record_verified(blob)
    return fetched


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _require_disk(folder: Path, needed_bytes: int, label: str) -> None:
    free_bytes = shutil.disk_usage(folder).free
    if free_bytes < needed_bytes + DISK_MARGIN_BYTES:
        raise HubError(
            f"Not enough free disk for {label}: needs {format_gib(needed_bytes)} "
            f"more, {format_gib(free_bytes)} free in {folder}.",
            hint="Free some space, or point HF_HOME / HF_HUB_CACHE at a larger disk.",
        )


def _download(
    settings: HubSettings, url: str, partial: Path, digest: RunningDigest, sink: ProgressSink
) -> int:
    """Fill ``partial`` up to the file's size, resuming on dropped connections; bytes fetched."""
    remote = digest.remote
    start_bytes = _size(partial)
    if start_bytes > remote.size_bytes:
        partial.unlink()
        start_bytes = 0
    _require_disk(partial.parent, remote.size_bytes - start_bytes, remote.path)
    if start_bytes:
        sink.note(f"resuming {remote.path} at {start_bytes / 2**20:.1f} MiB")
        digest.catch_up(partial, sink)  # the kept bytes count towards the checksum
    sink.start(remote.path, remote.size_bytes, start_bytes)
    stalls = 0
    try:
        while _size(partial) < remote.size_bytes or not partial.exists():
            before = _size(partial)
            try:
                _stream_once(settings, url, partial, digest, sink)
            except HubUnavailableError as error:
                stalls = 0 if _size(partial) > before else stalls + 1
                if stalls > MAX_STALLED_RETRIES:
                    raise _stalled(remote, partial, error) from error
                sink.note(f"connection lost at {_size(partial) / 2**20:.1f} MiB; resuming")
                time.sleep(RETRY_WAITS_S[min(stalls, len(RETRY_WAITS_S) - 1)])
    finally:
        sink.finish()
    return _size(partial) - start_bytes


def _stalled(remote: RemoteFile, partial: Path, error: HubError) -> HubError:
    kept = _size(partial)
    return HubError(
        f"The download of {remote.path} stopped: {error.message}",
        hint=f"{kept / 2**20:.1f} MiB of {remote.size_bytes / 2**20:.1f} MiB are kept; "
        "run the same pull again to resume.",
    )


def _stream_once(
    settings: HubSettings, url: str, partial: Path, digest: RunningDigest, sink: ProgressSink
) -> None:
    remote = digest.remote
    have = _size(partial)
    digest.catch_up(partial, None)  # bytes a failed write left on disk
    what = f"download {remote.path}"
    with open_range(
        settings, url, have, None, timeout_s=settings.download_timeout_s, what=what
    ) as response:
        if response.status_code == 416:  # the server's file ends before the size listed
            partial.unlink(missing_ok=True)
            served = response.headers.get("Content-Range", "").rpartition("/")[2] or "fewer"
            raise HubError(
                f"Cannot {what}: the server has {served} bytes of it, the hub lists "
                f"{remote.size_bytes:,}; the partial download was deleted.",
                hint="The hub's copy or a proxy is broken; try again later.",
            )
        if response.status_code == 200 and have:
            sink.note("the server cannot resume; starting over")
            sink.advance(-have)
            digest.reset()
            have = 0
        elif response.status_code != 200:
            _check_resume_range(response, have, what)
        _write_body(response, partial, have, digest, sink)


def _check_resume_range(response: httpx2.Response, have: int, what: str) -> None:
    content_range = response.headers.get("Content-Range", "")
    if response.status_code != 206 or not content_range.startswith(f"bytes {have}-"):
        raise HubError(
            f"Cannot {what}: the server answered HTTP {response.status_code} "
            f"({content_range or 'no Content-Range'}) to a resume request."
        )


def _write_body(
    response: httpx2.Response, partial: Path, have: int, digest: RunningDigest, sink: ProgressSink
) -> None:
    size = digest.remote.size_bytes
    with partial.open("ab" if have else "wb") as out:
        for chunk in response.iter_bytes():  # as received: a cut loses nothing buffered
            have += len(chunk)
            if have > size:
                out.close()
                partial.unlink()
                raise HubError(
                    f"The server sent more than the {size:,} bytes {digest.remote.path} has; "
                    "the download was deleted.",
                    hint="Check HF_ENDPOINT and any proxy in between.",
                )
            out.write(chunk)
            digest.update(chunk)
            sink.advance(len(chunk))


# ---- verification -------------------------------------------------------------------------


class RunningDigest:
    """The checksum the hub lists for a file, computed as the file is written.

    A download is hashed while it arrives, so a 40 GB file is not read a second time; bytes
    already on disk (a resumed download, a cached blob) are hashed by :meth:`catch_up`.
    LFS files are checked by sha256; small git files by their git blob id (sha1 over
    ``"blob <size>"``, a NUL byte, then the content).
    """

    def __init__(self, remote: RemoteFile) -> None:
        self.remote = remote
        self.kind = "sha256" if remote.sha256 else "git blob id"
        self.expected = (remote.sha256 or remote.blob_id or "").lower()
        self.reset()

    def reset(self) -> None:
        if self.remote.sha256:
            self._hasher = hashlib.sha256()
        else:
            self._hasher = hashlib.sha1(b"blob %d\0" % self.remote.size_bytes)
        self.done_bytes = 0

    def update(self, chunk: bytes) -> None:
        self._hasher.update(chunk)
        self.done_bytes += len(chunk)

    def catch_up(self, path: Path, sink: ProgressSink | None) -> None:
        """Hash what ``path`` holds beyond what was hashed (from the start if it shrank)."""
        size = _size(path)
        if size < self.done_bytes:
            self.reset()
        if size == self.done_bytes:
            return
        if sink is not None:
            sink.start(f"checking {self.remote.path}", size, self.done_bytes)
        with path.open("rb") as handle:
            handle.seek(self.done_bytes)
            while self.done_bytes < size and (chunk := handle.read(HASH_CHUNK_BYTES)):
                self.update(chunk[: size - self.done_bytes])
                if sink is not None:
                    sink.advance(len(chunk))
        if sink is not None:
            sink.finish()

    def problem(self, size: int) -> str | None:
        """None when ``size`` bytes were hashed and match the hub's checksum."""
        if size != self.remote.size_bytes:
            return f"size is {size:,} bytes, the hub lists {self.remote.size_bytes:,}"
        digest = self._hasher.hexdigest()
        if self.done_bytes != size or digest != self.expected:
            return f"{self.kind} is {digest[:16]}…, the hub lists {self.expected[:16]}…"
        return None


def verification_problem(path: Path, remote: RemoteFile, sink: ProgressSink) -> str | None:
    """None when the file at ``path`` has the size and checksum the hub lists."""
    digest = RunningDigest(remote)
    digest.catch_up(path, sink)
    return digest.problem(_size(path))


def _verified_record_path() -> Path:
    return data_dir() / "hub-verified.json"


def _read_records() -> dict[str, list[int]]:
    try:
        data = json.loads(_verified_record_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fingerprint(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _recorded_verified(blob: Path) -> bool:
    return _read_records().get(str(blob)) == _fingerprint(blob)


def _record_verified(blob: Path) -> None:
    records = _read_records()
    records[str(blob)] = _fingerprint(blob)
    target = _verified_record_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=1))
    os.replace(tmp, target)
