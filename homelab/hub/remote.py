"""Read a GGUF header on the hub without downloading the file: HTTP range requests.

:class:`RangeReader` gives the foundation's streaming header parser a ``read(n)`` over a
remote file. It fetches growing chunks (1 MiB, 2 MiB, … up to 64 MiB per request) and stops
at a hard cap on the bytes fetched per file, so a header that claims a huge string or
2^60 tensors costs at most the cap, and a stalled server at most the deadline.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2

from homelab.errors import HubError, ModelFileError
from homelab.gguf.header import RawHeader, check_data_fits, parse_header
from homelab.gguf.model import ModelInfo
from homelab.gguf.projector import ProjectorInfo, projector_from_header
from homelab.gguf.reader import model_from_headers
from homelab.hub.client import RepoListing, file_url, open_range
from homelab.hub.quants import GgufEntry, RemoteFile, best_projector
from homelab.hub.settings import HubSettings

FIRST_CHUNK_BYTES = 1 << 20
MAX_CHUNK_BYTES = 64 << 20
MAX_FETCHED_BYTES = 256 << 20  # per file; the largest real headers (vocabularies) are ~20 MB
HEADER_DEADLINE_S = 180.0  # per file, all requests together
PARALLEL_READS = 4
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class RangeReader:
    """``read(n)`` over a remote file through bounded HTTP range requests."""

    def __init__(
        self,
        settings: HubSettings,
        url: str,
        *,
        label: str,
        file_bytes: int | None,
        first_chunk_bytes: int = FIRST_CHUNK_BYTES,
        max_fetched_bytes: int = MAX_FETCHED_BYTES,
        deadline_s: float = HEADER_DEADLINE_S,
    ) -> None:
        self.settings = settings
        self.url = url
        self.label = label
        self.file_bytes = file_bytes
        self.max_fetched_bytes = max_fetched_bytes
        self.fetched_bytes = 0
        self.requests = 0
        self._next_chunk = first_chunk_bytes
        self._deadline = time.monotonic() + deadline_s
        self._buffer = b""
        self._position = 0  # read position inside _buffer
        self._buffer_end = 0  # file offset just after the buffer
        self._eof = False

    def read(self, n: int, /) -> bytes:
        while len(self._buffer) - self._position < n and not self._eof:
            self._fetch(n - (len(self._buffer) - self._position))
        data = self._buffer[self._position : self._position + n]
        self._position += len(data)
        return data

    def _fetch(self, missing: int) -> None:
        start = self._buffer_end
        size = max(missing, self._next_chunk)
        if self.file_bytes is not None:
            size = min(size, self.file_bytes - start)
        if size <= 0:
            self._eof = True
            return
        if self.fetched_bytes + size > self.max_fetched_bytes:
            raise ModelFileError(
                self.label,
                f"the header needs more than {self.max_fetched_bytes >> 20} MiB",
                hint="It is not a sane GGUF header; pick another file.",
            )
        data = self._get(start, size)
        self._next_chunk = min(self._next_chunk * 2, MAX_CHUNK_BYTES)
        got = len(data)  # a server may answer a range with less than asked: ask again
        reached_end = self.file_bytes is None or start + got >= self.file_bytes
        self._eof = got == 0 or (got < size and reached_end)
        self._buffer = self._buffer[self._position :] + data
        self._position = 0
        self._buffer_end = start + len(data)

    def _get(self, start: int, size: int) -> bytes:
        self.requests += 1
        remaining_s = self._deadline - time.monotonic()
        if remaining_s <= 0:
            raise HubError(
                f"Reading the header of {self.label} took too long.",
                hint="The connection is too slow or the server stalls; try again.",
            )
        what = f"read the header of {self.label}"
        timeout_s = min(self.settings.metadata_timeout_s, remaining_s)
        with open_range(
            self.settings, self.url, start, start + size - 1, timeout_s=timeout_s, what=what
        ) as response:
            if response.status_code == 416:
                return b""
            self._check_range(response, start)
            return self._body(response, size, what)

    def _check_range(self, response: httpx2.Response, start: int) -> None:
        if response.status_code == 200 and start == 0:
            return  # the server ignores ranges; the first bytes are still the right ones
        match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if response.status_code != 206 or not match or int(match[1]) != start:
            raise HubError(
                f"Cannot read the header of {self.label}: the server does not honour "
                f"byte ranges (HTTP {response.status_code}).",
                hint="Download the file with `homelab pull` instead.",
            )

    def _body(self, response: httpx2.Response, size: int, what: str) -> bytes:
        chunks: list[bytes] = []
        received = 0
        for chunk in response.iter_bytes():
            chunks.append(chunk[: size - received])
            received += len(chunks[-1])
            self.fetched_bytes += len(chunks[-1])
            if received >= size:
                break  # a server that sends more than asked is cut off here
            if time.monotonic() > self._deadline:
                raise HubError(f"Cannot {what}: the server is sending too slowly.")
        return b"".join(chunks)


def read_remote_header(
    settings: HubSettings,
    listing: RepoListing,
    remote: RemoteFile,
    *,
    first_chunk_bytes: int = FIRST_CHUNK_BYTES,
    max_fetched_bytes: int = MAX_FETCHED_BYTES,
) -> RawHeader:
    """Parse the header of one remote file and check its tensors fit in its size."""
    label = f"{listing.repo_id}/{remote.path}"
    url = file_url(settings, listing.repo_id, listing.commit, remote.path)
    reader = RangeReader(
        settings,
        url,
        label=label,
        file_bytes=remote.size_bytes or None,
        first_chunk_bytes=first_chunk_bytes,
        max_fetched_bytes=max_fetched_bytes,
    )
    header = parse_header(reader, label)
    if remote.size_bytes:
        check_data_fits(header, remote.size_bytes, label)
    return header


def remote_projector(
    settings: HubSettings, listing: RepoListing, entry: GgufEntry
) -> ProjectorInfo | None:
    """The projector a pull of ``entry`` would fetch, from its remote header (None when the
    repo has none, or its header is not a projector's)."""
    remote = best_projector(listing.projectors, entry)
    if remote is None:
        return None
    try:
        header = read_remote_header(settings, listing, remote)
        return projector_from_header(header, f"hf://{listing.repo_id}/{remote.path}")
    except (HubError, ModelFileError):
        return None


def remote_source(listing: RepoListing, entry: GgufEntry) -> str:
    return f"hf://{listing.repo_id}/{entry.first_path}"


def remote_model(settings: HubSettings, listing: RepoListing, entry: GgufEntry) -> ModelInfo:
    """The ModelInfo of a remote entry (every part of a split set), from headers alone."""
    headers = [read_remote_header(settings, listing, remote) for remote in entry.files]
    return model_from_headers(
        headers, remote_source(listing, entry), entry.total_bytes, default_name=entry.stem
    )


def remote_models(
    settings: HubSettings, listing: RepoListing, entries: tuple[GgufEntry, ...]
) -> list[ModelInfo | HubError | ModelFileError]:
    """ModelInfo for several entries, read in parallel; a failed read gives its error."""

    def one(entry: GgufEntry) -> ModelInfo | HubError | ModelFileError:
        try:
            return remote_model(settings, listing, entry)
        except (HubError, ModelFileError) as error:
            return error

    with ThreadPoolExecutor(max_workers=PARALLEL_READS) as pool:
        return list(pool.map(one, entries))
