"""PromptCache: saved sequence states in a RAM tier with a byte budget, over a capped disk tier.

One per process (the server's engines share it, so a model the fleet evicts and reloads
finds its states again). The RAM tier keeps states up to ``ram_budget_bytes``; the disk tier
keeps files up to ``disk_cap_bytes``. Both are shared by the tenants with a share each
(``tenant_share``, a quarter by default, see :mod:`.shares`): room is made first from the
tenant most over its share, least recently used first. A state whose tokens extend an older
one of the same tenant replaces it (the longer state serves every prompt the shorter did).

**The compute lane never waits on the disk.** :meth:`put` runs on the lane (a slot is about
to lose its cells) and never writes, deletes or waits: the states it moves out of RAM are
queued for the one writer thread, and their bytes count against the RAM budget until written,
so the bound holds. A new state goes in RAM when the budget has room once the states queued
before it are counted; else it is skipped (counted in ``skipped``): the writer is behind.
Each state kept makes room for the next one ahead of time (the RAM tier keeps one state's
worth free, being written). A state larger than the whole budget goes to the writer alone
(when nothing else is queued).
Files are deleted by the writer too. Only an engine's close, off the lane, may wait for room
(``put(..., wait=True)``), and :meth:`close` writes what is only in RAM for the next process.

**States expire** ``ttl_s`` after their last use (7 days by default): dropped when the cache
opens the folder, and looked for once a minute (``EXPIRE_EVERY_S``) when it is used.

Disk problems never stop serving: a full disk skips that file; a data folder that cannot be
written turns the disk tier off; a file that fails its checks is deleted. Each is logged
with what to do. :func:`folder_entries` lists a folder without opening a cache on it (it
deletes nothing: ``homelab prompt-cache`` beside a running server).
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from homelab.engine.prompt_cache import disk
from homelab.engine.prompt_cache.entry import Candidate, StateEntry, as_tokens
from homelab.engine.prompt_cache.key import ModelKey, tenant_matches, tenant_name
from homelab.engine.prompt_cache.prefix_index import PrefixIndex
from homelab.engine.prompt_cache.shares import share_bytes, victims
from homelab.llamacpp.state import StateBytes

log = logging.getLogger("homelab.engine.prompt_cache")

DEFAULT_MIN_TOKENS = 256  # shorter prefixes are prefilled quickly enough: not worth a state
DEFAULT_TENANT_SHARE = 0.25  # of the RAM budget and of the disk cap, before it is victimized
DEFAULT_TTL_S = 7 * 24 * 3600.0  # a state unused this long is deleted
EXPIRE_EVERY_S = 60.0


@dataclass(frozen=True)
class CacheConfig:
    ram_budget_bytes: int
    disk_cap_bytes: int
    directory: Path | None  # None: no disk tier
    min_tokens: int = DEFAULT_MIN_TOKENS  # a slot losing fewer tokens is not saved
    tenant_share: float = DEFAULT_TENANT_SHARE
    ttl_s: float = DEFAULT_TTL_S


@dataclass(frozen=True)
class CacheStats:
    ram_bytes: int
    disk_bytes: int
    ram_entries: int
    disk_entries: int
    hits_ram: int
    hits_disk: int
    misses: int
    saves: int
    skipped: int  # states not kept: RAM full of states the writer has not written yet
    spilled: int  # RAM states moved to disk
    evicted: int  # states dropped for room (from disk, or from RAM with no disk)
    expired: int  # states unused for ttl_s, deleted
    dropped_files: int  # files that failed their checks
    disk_problem: str | None  # why the disk tier is off (None: on, or never configured)


@dataclass(frozen=True)
class EntryInfo:
    """One saved state as ``homelab prompt-cache`` lists it."""

    model_id: str
    layout: str
    tenant: str  # the name
    identity: str  # the name and its generation (``key.tenant_identity``)
    n_tokens: int
    n_bytes: int
    in_ram: bool
    on_disk: bool
    last_used_s: float

    @classmethod
    def of(cls, entry: StateEntry, *, in_ram: bool, on_disk: bool) -> EntryInfo:
        return cls(
            entry.model.model_id, entry.model.layout, tenant_name(entry.tenant), entry.tenant,
            len(entry.tokens), entry.n_bytes, in_ram, on_disk, entry.last_used_s,
        )  # fmt: skip


@dataclass(eq=False)
class _Job:
    """The writer's work: ``spill`` (write, then free the RAM copy), ``write`` (write, keep
    the RAM copy; ``done`` says whether the file is there), ``unlink``, ``stop``."""

    kind: str
    entry: StateEntry | None = None
    path: Path | None = None
    done: Future[bool] | None = None


class PromptCache:
    """The process's saved states, by (model key, tenant identity); thread-safe."""

    def __init__(self, config: CacheConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock  # wall time: compared with the files' modification times
        self._lock = threading.Lock()
        self._index: dict[tuple[ModelKey, str], PrefixIndex] = {}
        self._counts: Counter[str] = Counter()
        self._disk_problem: str | None = None
        self._disk_writing_bytes = 0  # the file being written now (it counts against the cap)
        self._writes: queue.Queue[_Job] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._next_expiry_s = clock() + self._expiry_interval_s()
        if config.directory is not None:
            self._scan(config.directory)

    # --- lookups (on an engine's lane) -------------------------------------------------------

    def lookup(
        self, model: ModelKey, tenant: str, prompt: Sequence[int], at_least: int = 1
    ) -> Candidate | None:
        """The state of ``tenant`` on ``model`` serving the most of ``prompt``, if it serves
        ``at_least`` of its tokens; else None."""
        ids = as_tokens(prompt)
        with self._lock:
            self._expire_if_due()
            states = self._index.get((model, tenant))
            return states.best(ids, at_least) if states is not None else None

    def load(self, candidate: Candidate) -> StateBytes | None:
        """The candidate's state bytes (None: gone, or its file failed a check and is gone)."""
        entry = candidate.entry
        with self._lock:  # both read together: the writer may unlink the file meanwhile
            data, path = entry.data, entry.path
            entry.last_used_s = self._clock()
        if data is not None:
            self._count("hits_ram")
            return data
        if path is None:
            return None
        try:
            from_disk = disk.read_state(entry, path)  # gone since: an OSError, a miss
        except (OSError, disk.StateFileError) as exc:
            self._drop_file(entry, str(exc))
            return None
        self._count("hits_disk")
        return from_disk

    def latest(self, model: ModelKey, tenant: str) -> Candidate | None:
        """The most recently used state of ``tenant`` on ``model`` (whole), or None."""
        with self._lock:
            entries = list(self._index.get((model, tenant), ()))
            if not entries:
                return None
            entry = max(entries, key=lambda e: e.last_used_s)
            return Candidate(entry, len(entry.tokens))

    def discard(self, entry: StateEntry) -> None:
        """Forget ``entry`` and delete its file (llama.cpp refused it)."""
        with self._lock:
            self._unlink(entry)
            self._forget(entry)

    def record_miss(self) -> None:
        self._count("misses")

    def covers(
        self, model: ModelKey, tenant: str, tokens: Sequence[int], *, cuttable: bool = True
    ) -> bool:
        """Whether a state already holds ``tokens`` (or more after them, when states can be
        cut back: not a sliding-window model's); marks it used."""
        ids = as_tokens(tokens)
        longest = len(ids) + (1 << 30 if cuttable else 1)
        with self._lock:
            states = self._index.get((model, tenant))
            for entry in states.starting_with(ids) if states is not None else ():
                if len(entry.tokens) <= longest:
                    entry.last_used_s = self._clock()
                    return True
        return False

    # --- saving (on the lane: nothing here touches the disk or waits for the writer) ----------

    def put(
        self,
        model: ModelKey,
        tenant: str,
        tokens: Sequence[int] | np.ndarray,
        data: bytes | bytearray,
        *,
        cuttable: bool = True,
        wait: bool = False,
    ) -> bool:
        """Keep a state (True) or skip it (False: no room in RAM until the writer catches up).
        When states can be cut back (``cuttable``), it replaces the shorter ones it extends.
        ``wait``: wait for the writer when it is what stands in the way (never on the lane)."""
        entry = StateEntry(model, tenant, as_tokens(tokens), len(data), data, None, self._clock())
        while True:
            with self._lock:
                self._expire_if_due()
                where = self._place(entry)
                if where and cuttable:  # only once it is kept: a skipped state replaces none
                    self._supersede(entry)
                if where or not wait or not self._queued_bytes():
                    return self._keep(entry, where)
            self.wait_for_writes()

    def _place(self, entry: StateEntry) -> str:
        """Where a new state goes (under the lock): "ram", "disk" (the writer writes it and
        lets it go) or "" (nowhere: skipped)."""
        budget = self.config.ram_budget_bytes
        if entry.n_bytes <= budget:
            self._make_room(entry, entry.n_bytes)
            return "ram" if self._ram_bytes() + entry.n_bytes <= budget else ""
        return "disk" if self._disk_usable() and not self._queued_bytes() else ""

    def _keep(self, entry: StateEntry, where: str) -> bool:
        if not where:
            self._counts["skipped"] += 1
            return False
        self._counts["saves"] += 1
        self._index.setdefault((entry.model, entry.tenant), PrefixIndex()).add(entry)
        if where == "disk":
            entry.spilling = True
            self._queue(_Job("spill", entry))
        elif self._disk_usable():  # ahead: room for the next state, written meanwhile
            self._make_room(entry, entry.n_bytes)
        return True

    def _supersede(self, new: StateEntry) -> None:
        """Drop older states the new one extends (under the lock)."""
        states = self._index.get((new.model, new.tenant))
        if states is None:
            return
        for old in states.extended_by(new.tokens):
            self._unlink(old)
            self._forget(old)

    def _make_room(self, new: StateEntry, n_bytes: int) -> None:
        """Queue RAM states for disk until ``n_bytes`` more fit once the writer has written
        them (under the lock), the tenant most over its share first (``new``'s tenant gets
        the bytes). States already queued count as gone: counting them as staying would send
        every state to disk at once.

        With a disk tier, a state kept in RAM makes room for one more like it at once
        (``_keep``): what that sends to disk is written while the lane works on, so the next
        state finds room instead of waiting for the writer — or being skipped each time the
        tier is full. (Without one, room is made when needed: making it ahead would drop.)"""
        budget = self.config.ram_budget_bytes
        in_ram = [e for e in self._all() if e.data is not None]
        resident = [e for e in in_ram if not e.spilling]
        staying = sum(e.n_bytes for e in resident)
        usage = _usage(in_ram, lambda e: e.n_bytes, new.tenant, n_bytes)
        share = share_bytes(budget, self.config.tenant_share)
        for victim in victims(resident, usage, share, lambda e: e.n_bytes):
            if staying + n_bytes <= budget:
                return
            self._spill(victim)
            staying -= victim.n_bytes

    def _spill(self, entry: StateEntry) -> None:
        if entry.path is not None:  # already on disk: forget the RAM copy
            entry.data = None
            return
        if not self._disk_usable():
            self._forget(entry)
            self._counts["evicted"] += 1
            return
        entry.spilling = True
        self._counts["spilled"] += 1
        self._queue(_Job("spill", entry))

    # --- the writer thread: every file written or deleted while serving ----------------------

    def _queue(self, job: _Job) -> None:
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name="homelab-state-writer", daemon=True
            )
            self._writer.start()
        self._writes.put(job)

    def _write_loop(self) -> None:
        while True:
            job = self._writes.get()
            try:
                if job.kind == "stop":
                    return
                self._run(job)
            except Exception:  # the writer must outlive any one state
                log.exception("prompt cache: writing a state failed")
            finally:
                self._writes.task_done()

    def _run(self, job: _Job) -> None:
        if job.kind == "unlink":
            assert job.path is not None
            _delete(job.path)
            return
        assert job.entry is not None
        written = False
        try:
            written = self._write_entry(job.entry)
        finally:
            if job.kind == "spill":
                self._spilled(job.entry)
            if job.done is not None:
                job.done.set_result(written)

    def _write_entry(self, entry: StateEntry) -> bool:
        with self._lock:
            data, path = entry.data, entry.path
        if path is None and data is not None:
            self._write(entry, data)
        return entry.path is not None

    def _spilled(self, entry: StateEntry) -> None:
        """Its RAM copy goes (written or not); an entry in neither tier is forgotten."""
        with self._lock:
            entry.spilling = False
            entry.data = None
            if entry.path is None and self._is_indexed(entry):
                self._forget(entry)
                self._counts["evicted"] += 1

    def _write(self, entry: StateEntry, data: bytes | bytearray) -> None:
        """Write ``entry`` to disk within the cap; failures are logged, never raised."""
        root = self.config.directory
        if root is None or self._disk_problem is not None:
            return
        n_bytes = disk.estimated_file_bytes(entry)
        with self._lock:
            doomed = self._make_disk_room(entry, n_bytes) if self._is_indexed(entry) else None
            if doomed is None:
                return
            self._disk_writing_bytes += n_bytes  # counted while written
        for path in doomed:
            _delete(path)
        try:
            path = disk.write_state(root, entry, data)
        except OSError as exc:
            self._disk_failed(exc)
            return
        finally:
            with self._lock:
                self._disk_writing_bytes -= n_bytes
        with self._lock:
            if self._is_indexed(entry):
                entry.path, entry.file_bytes = path, n_bytes
                return
        _delete(path)  # superseded or cleared while being written

    def _make_disk_room(self, new: StateEntry, n_bytes: int) -> list[Path] | None:
        """The files to delete so that ``n_bytes`` more fit the cap, the tenant most over its
        share first (under the lock; forgotten here, deleted by the caller); None: too big."""
        cap = self.config.disk_cap_bytes
        if n_bytes > cap:
            return None
        on_disk = [e for e in self._all() if e.path is not None]
        usage = _usage(on_disk, lambda e: e.file_bytes, new.tenant, n_bytes)
        used, doomed = self._disk_bytes(), []
        share = share_bytes(cap, self.config.tenant_share)
        for victim in victims(on_disk, usage, share, lambda e: e.file_bytes):
            if used + n_bytes <= cap:
                break
            used -= victim.file_bytes
            doomed.append(self._detach(victim))
            if victim.data is None:
                self._forget(victim)
            self._counts["evicted"] += 1
        return [path for path in doomed if path is not None]

    def _disk_failed(self, exc: OSError) -> None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            log.warning(
                "prompt cache: the disk is full (%s); this state is not saved. Free space or "
                "lower --prompt-cache-disk-mib; serving goes on (prefilling).",
                exc,
            )
            return
        if exc.errno == errno.ENOENT:
            log.warning(
                "prompt cache: a state file vanished while it was written (%s): something else "
                "deletes files in %s. This state is not saved.",
                exc,
                self.config.directory,
            )
            return
        self._disk_problem = f"cannot write {self.config.directory}: {exc}"
        log.warning(
            "prompt cache: %s; the disk tier is off, states stay in RAM only. Make the data "
            "folder writable (or point HOMELAB_HOME elsewhere) to keep states across restarts.",
            self._disk_problem,
        )

    # --- what is on disk when the cache opens; expiry ------------------------------------------

    def _scan(self, root: Path) -> None:
        deadline = self._clock() - self.config.ttl_s
        for path in disk.state_files(root):
            if disk.is_temporary(path):
                if disk.is_abandoned(path):  # a write its process never finished
                    _delete(path)
                continue
            try:
                header, tokens, stat = disk.read_header(path)
            except (OSError, disk.StateFileError) as exc:
                self._drop_path(path, str(exc))
                _delete(path)
                continue
            if stat.st_mtime < deadline:
                self._counts["expired"] += 1
                _delete(path)
                continue
            entry = StateEntry(
                header.model, header.tenant, tokens, header.n_state_bytes, None, path,
                stat.st_mtime, stat.st_size,
            )  # fmt: skip
            self._index.setdefault((header.model, header.tenant), PrefixIndex()).add(entry)

    def _expiry_interval_s(self) -> float:
        return min(EXPIRE_EVERY_S, self.config.ttl_s / 4)

    def _expire_if_due(self) -> None:
        """Forget the states unused for ``ttl_s`` (under the lock; their files are deleted by
        the writer), at most once every ``EXPIRE_EVERY_S``."""
        now = self._clock()
        if now < self._next_expiry_s:
            return
        self._next_expiry_s = now + self._expiry_interval_s()
        deadline = now - self.config.ttl_s
        for entry in [e for e in self._all() if e.last_used_s < deadline]:
            self._unlink(entry)
            self._forget(entry)
            self._counts["expired"] += 1

    def _drop_file(self, entry: StateEntry, reason: str) -> None:
        with self._lock:
            self._forget(entry)
            path = self._detach(entry)  # under the lock: the writer may detach it too
            if path is not None:
                self._queue(_Job("unlink", path=path))
        if path is not None:
            self._drop_path(path, reason)

    def _drop_path(self, path: Path, reason: str) -> None:
        self._count("dropped")
        log.warning("prompt cache: dropped %s: %s", path, reason)

    # --- bookkeeping (under the lock) ----------------------------------------------------------

    def _all(self) -> list[StateEntry]:
        return [entry for entries in self._index.values() for entry in entries]

    def _ram_bytes(self) -> int:
        return sum(e.n_bytes for e in self._all() if e.data is not None)

    def _queued_bytes(self) -> int:
        return sum(e.n_bytes for e in self._all() if e.data is not None and e.spilling)

    def _disk_bytes(self) -> int:
        on_disk = sum(e.file_bytes for e in self._all() if e.path is not None)
        return on_disk + self._disk_writing_bytes

    def _disk_usable(self) -> bool:
        return self.config.directory is not None and self._disk_problem is None

    def _is_indexed(self, entry: StateEntry) -> bool:
        states = self._index.get((entry.model, entry.tenant))
        return states is not None and entry in states

    def _forget(self, entry: StateEntry) -> None:
        states = self._index.get((entry.model, entry.tenant))
        if states is not None:
            states.remove(entry)
            if not len(states):
                del self._index[(entry.model, entry.tenant)]
        entry.data = None

    def _detach(self, entry: StateEntry) -> Path | None:
        """Take the file off ``entry`` (the caller deletes it); the file it had, if any."""
        path, entry.path, entry.file_bytes = entry.path, None, 0
        return path

    def _unlink(self, entry: StateEntry) -> None:
        """Have the writer delete ``entry``'s file (never deleted on the caller's thread)."""
        path = self._detach(entry)
        if path is not None:
            self._queue(_Job("unlink", path=path))

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    # --- listing, clearing, closing (never on the lane) ------------------------------------------

    def stats(self) -> CacheStats:
        with self._lock:
            entries, counts = self._all(), self._counts
            return CacheStats(
                ram_bytes=self._ram_bytes(),
                disk_bytes=self._disk_bytes(),
                ram_entries=sum(e.data is not None for e in entries),
                disk_entries=sum(e.path is not None for e in entries),
                hits_ram=counts["hits_ram"],
                hits_disk=counts["hits_disk"],
                misses=counts["misses"],
                saves=counts["saves"],
                skipped=counts["skipped"],
                spilled=counts["spilled"],
                evicted=counts["evicted"],
                expired=counts["expired"],
                dropped_files=counts["dropped"],
                disk_problem=self._disk_problem,
            )

    def entries(self) -> list[EntryInfo]:
        with self._lock:
            return [
                EntryInfo.of(e, in_ram=e.data is not None, on_disk=e.path is not None)
                for e in sorted(self._all(), key=lambda e: -e.last_used_s)
            ]

    def clear(self, tenant: str | None = None, model_id: str | None = None) -> int:
        """Forget (and delete) the states of ``tenant`` (a name: every identity of it; or one
        identity) and of ``model_id`` (a model identity or its start); None: any. How many."""
        with self._lock:
            doomed = [
                e
                for e in self._all()
                if tenant_matches(e.tenant, tenant) and e.model.model_id.startswith(model_id or "")
            ]
            for entry in doomed:
                self._unlink(entry)
                self._forget(entry)
        self.wait_for_writes()  # their files are gone when this returns
        return len(doomed)

    def wait_for_writes(self) -> None:
        if self._writer is not None:
            self._writes.join()

    def persist(self, model: ModelKey, tenant: str, tokens: Sequence[int]) -> Future[bool]:
        """Have the state holding ``tokens`` written to disk (a save by hand). Never waits:
        the future says, once written, whether it is on disk (False: no such state, or no
        disk tier); wait for it off the lane."""
        done: Future[bool] = Future()
        ids = as_tokens(tokens)
        with self._lock:
            states = self._index.get((model, tenant))
            found = states.starting_with(ids) if states is not None else []
            if not found or found[0].path is not None or not self._disk_usable():
                done.set_result(bool(found) and found[0].path is not None)
                return done
            self._queue(_Job("write", found[0], done=done))
        return done

    def flush(self) -> None:
        """Write every state that is only in RAM to disk (the next process finds them), and
        mark the files of states used since they were written as used then (for ``ttl_s``)."""
        self.wait_for_writes()
        with self._lock:
            pending = [e for e in self._all() if e.data is not None and e.path is None]
            for entry in sorted(pending, key=lambda e: -e.last_used_s):  # most useful first
                self._queue(_Job("write", entry))
            used = [(e.path, e.last_used_s) for e in self._all() if e.path is not None]
        self.wait_for_writes()
        _touch(used)

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writes.put(_Job("stop"))
            self._writer.join()
            self._writer = None


def _usage(
    entries: Iterable[StateEntry], size: Callable[[StateEntry], int], tenant: str, n_new: int
) -> Counter[str]:
    """Bytes per tenant of ``entries``, with ``n_new`` more for ``tenant``."""
    usage: Counter[str] = Counter()
    for entry in entries:
        usage[entry.tenant] += size(entry)
    usage[tenant] += n_new
    return usage


def _delete(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("prompt cache: could not delete %s (%s)", path, exc)


def _touch(used: Iterable[tuple[Path, float]]) -> None:
    """Set each file's modification time to when its state was last used (if later)."""
    for path, used_s in used:
        try:
            if path.stat().st_mtime < used_s:
                os.utime(path, (used_s, used_s))
        except OSError:
            continue  # deleted meanwhile


def folder_entries(root: Path) -> list[EntryInfo]:
    """The states saved under ``root``, read without opening a cache on it: nothing is
    deleted or written (a server may be writing there now); files being written and files
    that fail their checks are left out."""
    found = []
    for _, header, tokens, stat in _saved_states(root):
        entry = StateEntry(header.model, header.tenant, tokens, header.n_state_bytes)
        entry.last_used_s = stat.st_mtime
        found.append(EntryInfo.of(entry, in_ram=False, on_disk=True))
    return sorted(found, key=lambda e: -e.last_used_s)


def delete_folder_states(root: Path, tenant: str | None, model_id: str | None) -> int:
    """Delete the state files under ``root`` of ``tenant`` and ``model_id`` (as
    :meth:`PromptCache.clear` matches them) when no server has them open; how many."""
    removed = 0
    for path, header, _, _ in _saved_states(root):
        if tenant_matches(header.tenant, tenant) and header.model.model_id.startswith(
            model_id or ""
        ):
            _delete(path)
            removed += 1
    return removed


def _saved_states(
    root: Path,
) -> Iterator[tuple[Path, disk.FileHeader, np.ndarray, os.stat_result]]:
    """Each finished state file under ``root`` that passes its checks, with its header."""
    for path in disk.state_files(root):
        if disk.is_temporary(path):
            continue
        try:
            header, tokens, stat = disk.read_header(path)
        except (OSError, disk.StateFileError):
            continue
        yield path, header, tokens, stat
