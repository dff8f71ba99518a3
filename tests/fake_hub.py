"""FakeHub: a local stand-in for the Hugging Face hub (there is no hub from this machine).

It serves what ``huggingface_hub`` 2.x actually calls, read from its source:

- ``GET /api/models?search=&filter=&sort=&limit=&expand=…`` — search (a JSON list);
- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` with ``?blobs=true``
  — repo info with ``sha`` and ``siblings`` (``size``, ``blobId``, ``lfs.sha256``…);
- ``HEAD|GET /{repo}/resolve/{rev}/{path}`` — for LFS files a 302 to a CDN on another
  origin, carrying ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256), ``X-Linked-Size`` and
  ``ETag``; for small git files a 200 with ``ETag`` = the git blob id. Errors carry the hub's
  ``X-Error-Code`` (``RepoNotFound``, ``EntryNotFound``, ``RevisionNotFound``);
- ``HEAD|GET /cdn/{sha256}`` on the CDN server — the bytes, honouring ``Range``.

Faults a test can switch on: cut the connection mid-body once, serve corrupted bytes,
serve a truncated file. Every request is logged (method, path, Range) for assertions.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class ConnectionCut(Exception):
    """Raised inside a response body to make the server drop the connection mid-stream."""


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    commit: str
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-06-01T12:00:00.000Z"

    def is_lfs(self, path: str) -> bool:
        return path.endswith(".gguf")


@dataclass(frozen=True)
class LoggedRequest:
    server: str  # "hub" or "cdn"
    method: str
    path: str
    range: str | None
    authorization: str | None
    query: str = ""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Faults:
    cut_after_bytes: dict[str, int] = field(default_factory=dict)  # sha256 -> cut once at N
    corrupt: set[str] = field(default_factory=set)  # sha256s served with one byte flipped
    truncate_to: dict[str, int] = field(default_factory=dict)  # sha256 -> serve only N bytes
    gated: set[str] = field(default_factory=set)  # repo ids whose files need an accepted license
    ignore_range: bool = False  # the CDN answers every GET with 200 and the whole file
    cdn_url: str | None = None  # send redirects here instead (e.g. a server that never answers)


class FakeHub:
    """Two local HTTP servers: the hub (API + resolve) and a CDN on another origin."""

    def __init__(self) -> None:
        self.hub = HTTPServer(host="127.0.0.1", threaded=True)
        self.cdn = HTTPServer(host="127.0.0.1", threaded=True)
        self.repos: dict[str, FakeRepo] = {}
        self.faults = Faults()
        self.log: list[LoggedRequest] = []
        self._lock = threading.Lock()

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeHub:
        for server in (self.hub, self.cdn):
            server.start()
        self.hub.expect_request(re.compile(r"^/api/models$")).respond_with_handler(self._search)
        self.hub.expect_request(re.compile(r"^/api/models/.+")).respond_with_handler(self._info)
        self.hub.expect_request(re.compile(r"^/[^/]+/[^/]+/resolve/.+")).respond_with_handler(
            self._resolve
        )
        self.cdn.expect_request(re.compile(r"^/cdn/[0-9a-f]{64}$")).respond_with_handler(self._cdn)
        return self

    def reset(self) -> None:
        """Forget repos, faults and the log (the servers keep running between tests)."""
        with self._lock:
            self.repos.clear()
            self.faults = Faults()
            self.log.clear()
        for server in (self.hub, self.cdn):
            server.clear_log()

    def stop(self) -> None:
        for server in (self.hub, self.cdn):
            if server.is_running():
                server.stop()

    @property
    def endpoint(self) -> str:
        return self.hub.url_for("/").rstrip("/")

    def add_repo(
        self, repo_id: str, files: dict[str, bytes | Path], *, downloads: int = 0, likes: int = 0
    ) -> FakeRepo:
        contents = {p: v.read_bytes() if isinstance(v, Path) else v for p, v in files.items()}
        commit = hashlib.sha1(repo_id.encode() + str(sorted(contents)).encode()).hexdigest()
        repo = FakeRepo(repo_id, contents, commit, downloads, likes)
        self.repos[repo_id] = repo
        return repo

    def requests(self, server: str | None = None, method: str | None = None) -> list[LoggedRequest]:
        with self._lock:
            return [
                r
                for r in self.log
                if (server is None or r.server == server) and (method is None or r.method == method)
            ]

    def clear_log(self) -> None:
        with self._lock:
            self.log.clear()

    def _record(self, server: str, request: Request) -> None:
        with self._lock:
            self.log.append(
                LoggedRequest(
                    server,
                    request.method,
                    request.path,
                    request.headers.get("Range"),
                    request.headers.get("Authorization"),
                    request.query_string.decode(),
                )
            )

    # ---- the API ------------------------------------------------------------------------

    def _search(self, request: Request) -> Response:
        self._record("hub", request)
        query = request.args.get("search", "").lower()
        limit = int(request.args.get("limit", "1000"))
        hits = sorted(
            (r for r in self.repos.values() if query in r.repo_id.lower()),
            key=lambda r: -r.downloads,
        )
        items = [
            {
                "_id": r.commit[:24],
                "id": r.repo_id,
                "modelId": r.repo_id,
                "downloads": r.downloads,
                "likes": r.likes,
                "lastModified": r.last_modified,
                "tags": ["gguf"],
                "library_name": "gguf",
            }
            for r in hits[:limit]
        ]
        return _json(items)

    def _info(self, request: Request) -> Response:
        self._record("hub", request)
        match = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?$", request.path)
        repo = self.repos.get(match[1]) if match else None
        if repo is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if match and match[2] not in (None, "main", repo.commit):
            return _error(404, "RevisionNotFound", "Invalid rev id")
        blobs = request.args.get("blobs") in ("true", "True", "1")
        siblings = [self._sibling(repo, path, blobs) for path in sorted(repo.files)]
        return _json(
            {
                "_id": repo.commit[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.commit,
                "downloads": repo.downloads,
                "likes": repo.likes,
                "lastModified": repo.last_modified,
                "tags": ["gguf"],
                "private": False,
                "siblings": siblings,
            }
        )

    def _sibling(self, repo: FakeRepo, path: str, blobs: bool) -> dict[str, object]:
        if not blobs:
            return {"rfilename": path}
        data = repo.files[path]
        entry: dict[str, object] = {
            "rfilename": path,
            "size": len(data),
            "blobId": git_blob_id(data),
        }
        if repo.is_lfs(path):
            entry["lfs"] = {"size": len(data), "sha256": sha256(data), "pointerSize": 134}
        return entry

    # ---- files --------------------------------------------------------------------------

    def _resolve(self, request: Request) -> Response:
        self._record("hub", request)
        match = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", request.path)
        repo = self.repos.get(match[1]) if match else None
        if repo is None or match is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if match[2] not in ("main", repo.commit):
            return _error(404, "RevisionNotFound", "Invalid rev id")
        if repo.repo_id in self.faults.gated:
            status = 403 if request.headers.get("Authorization") else 401
            return _error(status, "GatedRepo", "Access to model is restricted.")
        data = repo.files.get(match[3])
        if data is None:
            return _error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if not repo.is_lfs(match[3]):
            headers["ETag"] = f'"{git_blob_id(data)}"'
            return _ranged(request, data, headers)
        digest = sha256(data)
        headers.update(
            {
                "X-Linked-Etag": f'"{digest}"',
                "X-Linked-Size": str(len(data)),
                "ETag": f'"{git_blob_id(data)}"',
                "Location": f"{self.faults.cdn_url or self.cdn.url_for('/cdn')}/{digest}",
            }
        )
        return Response(b"", status=302, headers=headers)

    def _blob(self, digest: str) -> bytes | None:
        for repo in self.repos.values():
            for data in repo.files.values():
                if sha256(data) == digest:
                    return data
        return None

    def _cdn(self, request: Request) -> Response:
        self._record("cdn", request)
        digest = request.path.rsplit("/", 1)[-1]
        data = self._blob(digest)
        if data is None:
            return Response(b"NoSuchKey", status=404)
        if digest in self.faults.corrupt:
            data = data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:]
        if digest in self.faults.truncate_to:
            data = data[: self.faults.truncate_to[digest]]
        cut = self.faults.cut_after_bytes.pop(digest, None)
        return _ranged(
            request,
            data,
            {"ETag": f'"{digest}"', "Accept-Ranges": "bytes"},
            cut,
            self.faults.ignore_range,
        )


def _json(payload: object) -> Response:
    return Response(json.dumps(payload), status=200, content_type="application/json")


def _error(status: int, code: str, message: str, commit: str | None = None) -> Response:
    headers = {"X-Error-Code": code, "X-Error-Message": message}
    if commit:
        headers["X-Repo-Commit"] = commit
    return Response(
        json.dumps({"error": message}),
        status=status,
        headers=headers,
        content_type="application/json",
    )


def _ranged(
    request: Request,
    data: bytes,
    headers: dict[str, str],
    cut_after: int | None = None,
    ignore_range: bool = False,
) -> Response:
    start, end = 0, len(data) - 1
    status = 200
    match = None if ignore_range else _RANGE.match(request.headers.get("Range", ""))
    if match:
        start = int(match[1])
        end = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)
        if start >= len(data):
            return Response(b"", status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        status = 206
        headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
    body = data[start : end + 1]
    headers = {**headers, "Content-Length": str(len(body))}
    if request.method == "HEAD":  # an iterator, so werkzeug keeps our Content-Length
        return Response(iter([b""]), status=status, headers=headers, direct_passthrough=True)
    if cut_after is not None and cut_after < len(body):
        return Response(
            _cut(body, cut_after), status=status, headers=headers, direct_passthrough=True
        )
    return Response(body, status=status, headers=headers, content_type="application/octet-stream")


def _cut(body: bytes, cut_after: int):  # type: ignore[no-untyped-def]
    yield body[:cut_after]
    raise ConnectionCut(f"FakeHub cut the connection after {cut_after} bytes")


def now_iso() -> str:
    return datetime.now(UTC).isoformat()
