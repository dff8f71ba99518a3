"""The one doorway to the Hugging Face hub: search, repo listings and bounded byte streams.

Requests go through ``huggingface_hub``'s shared HTTP session, with its headers (token, user
agent) and URL scheme. Every call has a connect/read timeout and an overall deadline, and
every body is read with a byte cap, so a stalled or lying server costs bounded time and
memory. Errors from the hub or the network become :class:`~homelab.errors.HubError`
naming what failed and what to do.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx2
from huggingface_hub import hf_hub_url
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.hf_api import ModelInfo as HubModelInfo
from huggingface_hub.utils import build_hf_headers, get_session

from homelab.errors import HubError
from homelab.hub.quants import GgufEntry, RemoteFile, group_entries, projector_files
from homelab.hub.settings import HubSettings

MAX_JSON_BYTES = 32 << 20  # a repo listing of 10,000 files is ~3 MB
MAX_ERROR_BODY_BYTES = 64 << 10
DEADLINE_FACTOR = 6  # overall deadline of one call = timeout x this
SEARCH_FIELDS = ("downloads", "likes", "lastModified", "tags")
# what the hub's ids look like; anything else is refused (they become file names on disk)
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
GIT_ID_RE = re.compile(r"[0-9a-f]{40}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class RepoSummary:
    """One search hit."""

    repo_id: str
    downloads: int | None
    likes: int | None
    updated: str | None  # ISO date of the last commit


@dataclass(frozen=True)
class RepoListing:
    """A repo's GGUF files at one commit."""

    repo_id: str
    commit: str  # every download and header read is pinned to this commit
    entries: tuple[GgufEntry, ...]
    projectors: tuple[RemoteFile, ...]  # mmproj files, listed apart


class HubUnavailableError(HubError):
    """The hub could not be reached, timed out, or failed on its side: worth retrying."""


class HubOfflineError(HubUnavailableError):
    """HF_HUB_OFFLINE is set and what was asked needs the hub."""


def require_online(settings: HubSettings, what: str) -> None:
    if settings.offline:
        raise HubOfflineError(
            f"HF_HUB_OFFLINE is set, so homelab will not contact the hub to {what}.",
            hint="Unset HF_HUB_OFFLINE, or use a model that is already downloaded "
            "(`homelab models`).",
        )


def request_headers(settings: HubSettings, extra: dict[str, str] | None = None) -> dict[str, str]:
    from homelab import __version__

    headers: dict[str, str] = build_hf_headers(
        token=settings.token or False, library_name="homelab", library_version=__version__
    )
    headers["Accept-Encoding"] = "identity"  # sizes and byte ranges must be the file's own
    headers.update(extra or {})
    return headers


def timeout_for(seconds: float) -> httpx2.Timeout:
    return httpx2.Timeout(seconds, connect=seconds)


@contextmanager
def hub_errors(settings: HubSettings, what: str, timeout_s: float | None = None) -> Iterator[None]:
    """Turn network and protocol failures into HubError (a HubError passes through)."""
    waited_s = settings.metadata_timeout_s if timeout_s is None else timeout_s
    try:
        yield
    except HubError:
        raise
    except OfflineModeIsEnabled as exc:
        raise HubError(
            f"Cannot {what}: offline mode is enabled.",
            hint="Unset HF_HUB_OFFLINE to reach the hub.",
        ) from exc
    except httpx2.TimeoutException as exc:
        raise HubUnavailableError(
            f"Timed out trying to {what} at {settings.endpoint} (no answer within {waited_s:g} s).",
            hint="Check your connection, or raise HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT.",
        ) from exc
    except httpx2.TooManyRedirects as exc:
        raise HubError(f"Cannot {what}: the server redirected too many times.") from exc
    except (httpx2.TransportError, httpx2.StreamError) as exc:
        raise HubUnavailableError(
            f"Cannot {what}: the connection to {settings.endpoint} failed ({exc}).",
            hint="Check your connection or HF_ENDPOINT; set HF_HUB_OFFLINE=1 to use "
            "downloaded models only.",
        ) from exc


def status_error(response: httpx2.Response, what: str) -> HubError:
    """A HubError for an HTTP error status, using the hub's X-Error-Code header."""
    status = response.status_code
    code = response.headers.get("X-Error-Code", "")
    message = response.headers.get("X-Error-Message", "")
    detail = f" ({message})" if message else ""
    if code == "GatedRepo" or (status == 403 and "gated" in message.lower()):
        return HubError(
            f"Cannot {what}: the repo is gated{detail}.",
            hint="Accept its license on the hub's page, then set HF_TOKEN.",
        )
    if code == "EntryNotFound" or (status == 404 and not code and "/resolve/" in str(response.url)):
        return HubError(
            f"Cannot {what}: the file does not exist in the repo (404).",
            hint="Run `homelab search REPO` to see its files.",
        )
    if code == "RevisionNotFound":
        return HubError(f"Cannot {what}: the revision does not exist (404).")
    if code == "RepoNotFound" or status in (401, 404):
        return HubError(
            f"Cannot {what}: repository not found ({status}){detail}.",
            hint="Check the name; for a private or gated repo set HF_TOKEN.",
        )
    if status == 429:
        return HubUnavailableError(
            f"Cannot {what}: the hub is rate-limiting requests (429).",
            hint="Wait a minute, or set HF_TOKEN (logged-in users get more).",
        )
    if status >= 500:
        return HubUnavailableError(
            f"Cannot {what}: the hub had a server error ({status}).", hint="Try again later."
        )
    return HubError(f"Cannot {what}: the server answered HTTP {status}{detail}.")


def read_capped(response: httpx2.Response, max_bytes: int, deadline: float, what: str) -> bytes:
    """The body, refusing more than ``max_bytes`` or reading past ``deadline``."""
    chunks: list[bytes] = []
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > max_bytes:
            raise HubError(
                f"Cannot {what}: the answer is larger than {max_bytes >> 20} MiB.",
                hint="The server is not behaving like the hub; check HF_ENDPOINT.",
            )
        if time.monotonic() > deadline:
            raise HubError(f"Cannot {what}: the server is sending too slowly.")
        chunks.append(chunk)
    return b"".join(chunks)


def get_json(settings: HubSettings, url: str, params: list[tuple[str, str]], what: str) -> Any:
    """GET ``url`` and decode its JSON body, bounded in size and time."""
    require_online(settings, what)
    timeout = settings.metadata_timeout_s
    deadline = time.monotonic() + timeout * DEADLINE_FACTOR
    with (
        hub_errors(settings, what),
        get_session().stream(
            "GET",
            url,
            params=tuple(params),
            headers=request_headers(settings),
            timeout=timeout_for(timeout),
            follow_redirects=True,
        ) as response,
    ):
        if response.status_code >= 400:
            raise status_error(response, what)
        body = read_capped(response, MAX_JSON_BYTES, deadline, what)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise HubError(
            f"Cannot {what}: the server's answer is not JSON.",
            hint="Check HF_ENDPOINT points at the hub.",
        ) from exc


def search_repos(settings: HubSettings, query: str, limit: int = 20) -> list[RepoSummary]:
    """GGUF repos matching ``query``, most downloaded first."""
    params = [
        ("search", query),
        ("filter", "gguf"),
        ("sort", "downloads"),
        ("limit", str(limit)),
    ] + [("expand", field) for field in SEARCH_FIELDS]
    data = get_json(settings, f"{settings.endpoint}/api/models", params, f"search for {query!r}")
    if not isinstance(data, list):
        raise HubError("The hub's search answer is not a list.", hint="Check HF_ENDPOINT.")
    return [_summary(item) for item in data[:limit] if isinstance(item, dict) and "id" in item]


def _summary(item: dict[str, Any]) -> RepoSummary:
    try:
        info = HubModelInfo(**item)
    except (KeyError, TypeError, ValueError) as exc:
        raise HubError(f"The hub's search answer is malformed ({exc!r}).") from exc
    updated = info.last_modified.date().isoformat() if info.last_modified else None
    return RepoSummary(info.id, info.downloads, info.likes, updated)


def repo_listing(settings: HubSettings, repo_id: str, revision: str = "main") -> RepoListing:
    """The repo's GGUF files with sizes and LFS sha256, pinned to the current commit."""
    url = f"{settings.endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}"
    data = get_json(settings, url, [("blobs", "true")], f"list the files of {repo_id}")
    if not isinstance(data, dict):
        raise HubError(
            f"The hub's answer for {repo_id} is not an object.", hint="Check HF_ENDPOINT."
        )
    try:
        info = HubModelInfo(**{**data, "id": repo_id})
        files = [_remote_file(s) for s in info.siblings or []]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HubError(
            f"The hub's file listing for {repo_id} is malformed ({exc!r}).",
            hint="Check HF_ENDPOINT points at the hub.",
        ) from exc
    if not isinstance(info.sha, str) or not COMMIT_RE.fullmatch(info.sha):
        raise HubError(
            f"The hub did not say which commit {repo_id} is at (got {info.sha!r}).",
            hint="Check HF_ENDPOINT points at the hub.",
        )
    safe = [f for f in files if is_safe_repo_path(f.path)]  # names become paths on disk
    return RepoListing(repo_id, info.sha, group_entries(safe), projector_files(safe))


def is_safe_repo_path(path: str) -> bool:
    """A relative path inside the repo: no '..', no absolute path, no backslash, NUL or ':'."""
    parts = path.split("/")
    odd = any(char in path for char in ("\\", "\x00", ":"))
    return bool(path) and not odd and not any(p in ("", ".", "..") for p in parts)


def _remote_file(sibling: Any) -> RemoteFile:
    lfs = sibling.lfs
    size = sibling.size if sibling.size is not None else (lfs.size if lfs else 0)
    sha256 = lfs.sha256 if lfs and SHA256_RE.fullmatch(str(lfs.sha256)) else None
    blob_id = sibling.blob_id if GIT_ID_RE.fullmatch(str(sibling.blob_id)) else None
    return RemoteFile(str(sibling.rfilename), int(size or 0), sha256, blob_id)


def file_url(settings: HubSettings, repo_id: str, commit: str, path: str) -> str:
    return str(hf_hub_url(repo_id, path, revision=commit, endpoint=settings.endpoint))


@contextmanager
def open_range(
    settings: HubSettings, url: str, start: int, end: int | None, *, timeout_s: float, what: str
) -> Iterator[httpx2.Response]:
    """Stream bytes ``start``..``end`` (inclusive; None: to the end) of ``url``.

    Redirects are followed (the hub sends LFS files to a CDN; the token is not forwarded to
    another host). The response is 206 with the range, or 200 with the whole file when the
    server ignores ranges; callers check which.
    """
    require_online(settings, what)
    wanted = (
        {}
        if start == 0 and end is None
        else {"Range": f"bytes={start}-{'' if end is None else end}"}
    )
    headers = request_headers(settings, wanted)
    with (
        hub_errors(settings, what, timeout_s),
        get_session().stream(
            "GET", url, headers=headers, timeout=timeout_for(timeout_s), follow_redirects=True
        ) as response,
    ):
        if response.status_code >= 400 and response.status_code != 416:
            raise status_error(response, what)
        yield response
