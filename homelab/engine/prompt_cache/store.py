"""PromptCache: saved sequence states in a RAM tier with a byte budget, over a capped disk tier.

One per process (the server's engines share it, so a model the fleet evicts and reloads
finds its states again). The RAM tier keeps states up to ``ram_budget_bytes``; the least
recently used go to disk when a new one needs room (a writer thread writes them; until it
has, their bytes still count against the budget, so the bound holds), and a state larger
than the whole budget is written straight to disk. The disk tier keeps files up to
``disk_cap_bytes``, the least recently used deleted first. A state whose tokens extend an
older one of the same tenant replaces it (the longer state serves every prompt the shorter
did). :meth:`close` writes what is only in RAM to disk, for the next process.

Disk problems never stop serving: a full disk skips that file; a data folder that cannot be
written turns the disk tier off; a file that fails its checks is deleted. Each is logged
with what to do.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from homelab.engine.prompt_cache import disk
from homelab.engine.prompt_cache.entry import Candidate, StateEntry, as_tokens
from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.prefix_index import PrefixIndex
from homelab.llamacpp.state import StateBytes

log = logging.getLogger("homelab.engine.prompt_cache")

DEFAULT_MIN_TOKENS = 256  # shorter prefixes are prefilled quickly enough: not worth a state
_STOP = object()


@dataclass(frozen=True)
class CacheConfig:
    ram_budget_bytes: int
    disk_cap_bytes: int
    directory: Path | None  # None: no disk tier
    min_tokens: int = DEFAULT_MIN_TOKENS  # a slot losing fewer tokens is not saved


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
    spilled: int  # RAM states moved to disk
    evicted: int  # states dropped for room (from disk, or from RAM with no disk)
    dropped_files: int  # files that failed their checks
    disk_problem: str | None  # why the disk tier is off (None: on, or never configured)


@dataclass(frozen=True)
class EntryInfo:
    """One saved state as ``homelab prompt-cache`` lists it."""

    model_id: str
    layout: str
    tenant: str
    n_tokens: int
    n_bytes: int
    in_ram: bool
    on_disk: bool
    last_used_s: float


class PromptCache:
    """The process's saved states, by (model key, tenant); thread-safe."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._index: dict[tuple[ModelKey, str], PrefixIndex] = {}
        self._counts = dict.fromkeys(
            ("hits_ram", "hits_disk", "misses", "saves", "spilled", "evicted", "dropped"), 0
        )
        self._disk_problem: str | None = None
        self._disk_writing_bytes = 0  # files being written now (they count against the cap)
        self._writes: queue.Queue[object] = queue.Queue()
        self._writer: threading.Thread | None = None
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
            states = self._index.get((model, tenant))
            return states.best(ids, at_least) if states is not None else None

    def load(self, candidate: Candidate) -> StateBytes | None:
        """The candidate's state bytes (None: gone, or its file failed a check and is gone)."""
        entry = candidate.entry
        with self._lock:  # both read together: the writer may unlink the file meanwhile
            data, path = entry.data, entry.path
            entry.last_used_s = time.time()
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
                    entry.last_used_s = time.time()
                    return True
        return False

    # --- saving --------------------------------------------------------------------------------

    def put(
        self,
        model: ModelKey,
        tenant: str,
        tokens: Sequence[int],
        data: bytes | bytearray,
        *,
        cuttable: bool = True,
    ) -> None:
        """Keep a state (in RAM when it fits the budget, else straight on disk). When states
        can be cut back (``cuttable``), it replaces the shorter ones it extends."""
        entry = StateEntry(model, tenant, as_tokens(tokens), len(data), data, None, time.time())
        with self._lock:
            if cuttable:
                self._supersede(entry)
            self._counts["saves"] += 1
        direct = entry.n_bytes > self.config.ram_budget_bytes or not self._room_for(entry)
        if direct:
            entry.data = None
        with self._lock:
            self._index.setdefault((model, tenant), PrefixIndex()).add(entry)
        if direct:
            self._write(entry, data)
            self._forget_if_nowhere(entry)

    def _forget_if_nowhere(self, entry: StateEntry) -> None:
        """An entry neither in RAM nor on disk (its write was skipped or failed) is gone."""
        with self._lock:
            if entry.data is None and entry.path is None and self._is_indexed(entry):
                self._forget(entry)
                self._counts["evicted"] += 1

    def _room_for(self, entry: StateEntry) -> bool:
        """Make RAM room for ``entry``: spill, and wait for the writer while what it still
        holds is in the way (the budget counts states queued for disk). False: no room."""
        while True:
            with self._lock:
                self._make_room(entry.n_bytes)
                if self._ram_bytes() + entry.n_bytes <= self.config.ram_budget_bytes:
                    return True
                waiting = any(e.spilling for e in self._all())
            if not waiting:
                return False
            self.wait_for_writes()

    def _supersede(self, new: StateEntry) -> None:
        """Drop older states the new one extends (under the lock)."""
        states = self._index.get((new.model, new.tenant))
        if states is None:
            return
        for old in states.extended_by(new.tokens):
            states.remove(old)
            self._unlink(old)

    def _make_room(self, n_bytes: int) -> None:
        """Move least recently used RAM states out until ``n_bytes`` more fit once the writer
        has written what it holds (under the lock). States already queued for disk count as
        gone: counting them as staying would send every state to disk at once."""
        in_ram = [e for e in self._all() if e.data is not None]
        staying = sum(e.n_bytes for e in in_ram if not e.spilling)
        resident = sorted((e for e in in_ram if not e.spilling), key=lambda e: e.last_used_s)
        for victim in resident:
            if staying + n_bytes <= self.config.ram_budget_bytes:
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
        self._ensure_writer()
        self._writes.put(entry)

    # --- the disk tier --------------------------------------------------------------------

    def _disk_usable(self) -> bool:
        return self.config.directory is not None and self._disk_problem is None

    def _ensure_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_loop, name="homelab-state-writer", daemon=True
            )
            self._writer.start()

    def _write_loop(self) -> None:
        while True:
            item = self._writes.get()
            try:
                if item is _STOP:
                    return
                assert isinstance(item, StateEntry)
                self._spill_one(item)
            except Exception:  # the writer must outlive any one state
                log.exception("prompt cache: writing a state failed")
            finally:
                self._writes.task_done()

    def _spill_one(self, entry: StateEntry) -> None:
        """Write a state the RAM tier let go of, then free its RAM (on the writer thread)."""
        try:
            if entry.data is not None:
                self._write(entry, entry.data)
        finally:
            with self._lock:
                entry.spilling = False
                entry.data = None
            self._forget_if_nowhere(entry)

    def _write(self, entry: StateEntry, data: bytes | bytearray) -> None:
        """Write ``entry`` to disk within the cap; failures are logged, never raised."""
        root = self.config.directory
        if root is None or self._disk_problem is not None:
            return
        n_bytes = disk.estimated_file_bytes(entry)
        with self._lock:
            if not self._make_disk_room(n_bytes):
                return
            self._disk_writing_bytes += n_bytes  # counted while written: two writes fit the cap
        try:
            path = disk.write_state(root, entry, data)
        except OSError as exc:
            self._disk_failed(exc)
            return
        finally:
            with self._lock:
                self._disk_writing_bytes -= n_bytes
        with self._lock:
            entry.path, entry.file_bytes = path, n_bytes
            if not self._is_indexed(entry):  # superseded or cleared while being written
                path.unlink(missing_ok=True)
                entry.path = None

    def _make_disk_room(self, n_bytes: int) -> bool:
        """Delete least recently used files until ``n_bytes`` fit the cap (under the lock)."""
        cap = self.config.disk_cap_bytes
        if n_bytes > cap:
            return False
        on_disk = sorted(
            (e for e in self._all() if e.path is not None), key=lambda e: e.last_used_s
        )
        while on_disk and self._disk_bytes() + n_bytes > cap:
            victim = on_disk.pop(0)
            self._unlink(victim)
            if victim.data is None:
                self._forget(victim)
            self._counts["evicted"] += 1
        return True

    def _disk_failed(self, exc: OSError) -> None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            log.warning(
                "prompt cache: the disk is full (%s); this state is not saved. Free space or "
                "lower --prompt-cache-disk-mib; serving goes on (prefilling).",
                exc,
            )
            return
        self._disk_problem = f"cannot write {self.config.directory}: {exc}"
        log.warning(
            "prompt cache: %s; the disk tier is off, states stay in RAM only. Make the data "
            "folder writable (or point HOMELAB_HOME elsewhere) to keep states across restarts.",
            self._disk_problem,
        )

    def _scan(self, root: Path) -> None:
        for path in disk.state_files(root):
            if disk.is_temporary(path):  # a write that never finished
                path.unlink(missing_ok=True)
                continue
            try:
                header, tokens = disk.read_header(path)
            except (OSError, disk.StateFileError) as exc:
                self._drop_path(path, str(exc))
                continue
            entry = StateEntry(
                header.model, header.tenant, tokens, header.n_state_bytes, None, path,
                path.stat().st_mtime, path.stat().st_size,
            )  # fmt: skip
            self._index.setdefault((header.model, header.tenant), PrefixIndex()).add(entry)

    def _drop_file(self, entry: StateEntry, reason: str) -> None:
        with self._lock:
            self._forget(entry)
            path = entry.path  # read under the lock: the writer may set it to None
        if path is not None:
            self._drop_path(path, reason)

    def _drop_path(self, path: Path, reason: str) -> None:
        self._count("dropped")
        log.warning("prompt cache: dropped %s: %s", path, reason)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("prompt cache: could not delete %s (%s)", path, exc)

    # --- bookkeeping (under the lock) ----------------------------------------------------------

    def _all(self) -> list[StateEntry]:
        return [entry for entries in self._index.values() for entry in entries]

    def _ram_bytes(self) -> int:
        return sum(e.n_bytes for e in self._all() if e.data is not None)

    def _disk_bytes(self) -> int:
        on_disk = sum(e.file_bytes for e in self._all() if e.path is not None)
        return on_disk + self._disk_writing_bytes

    def _is_indexed(self, entry: StateEntry) -> bool:
        states = self._index.get((entry.model, entry.tenant))
        return states is not None and entry in states

    def _forget(self, entry: StateEntry) -> None:
        states = self._index.get((entry.model, entry.tenant))
        if states is not None:
            states.remove(entry)
        entry.data = None

    def _unlink(self, entry: StateEntry) -> None:
        if entry.path is not None:
            try:
                entry.path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("prompt cache: could not delete %s (%s)", entry.path, exc)
            entry.path = None

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    # --- listing, clearing, closing -------------------------------------------------------------

    def stats(self) -> CacheStats:
        with self._lock:
            entries = self._all()
            counts = dict(self._counts)
            return CacheStats(
                ram_bytes=self._ram_bytes(),
                disk_bytes=self._disk_bytes(),
                ram_entries=sum(e.data is not None for e in entries),
                disk_entries=sum(e.path is not None for e in entries),
                hits_ram=counts["hits_ram"],
                hits_disk=counts["hits_disk"],
                misses=counts["misses"],
                saves=counts["saves"],
                spilled=counts["spilled"],
                evicted=counts["evicted"],
                dropped_files=counts["dropped"],
                disk_problem=self._disk_problem,
            )

    def entries(self) -> list[EntryInfo]:
        with self._lock:
            return [
                EntryInfo(
                    e.model.model_id,
                    e.model.layout,
                    e.tenant,
                    len(e.tokens),
                    e.n_bytes,
                    e.data is not None,
                    e.path is not None,
                    e.last_used_s,
                )
                for e in sorted(self._all(), key=lambda e: -e.last_used_s)
            ]

    def clear(self, tenant: str | None = None, model_id: str | None = None) -> int:
        """Forget (and delete) the states of ``tenant`` / ``model_id`` (None: any); how many."""
        self.wait_for_writes()
        with self._lock:
            doomed = [
                e
                for e in self._all()
                if (tenant is None or e.tenant == tenant)
                and (model_id is None or e.model.model_id == model_id)
            ]
            for entry in doomed:
                self._unlink(entry)
                self._forget(entry)
        return len(doomed)

    def wait_for_writes(self) -> None:
        if self._writer is not None:
            self._writes.join()

    def persist(self, model: ModelKey, tenant: str, tokens: Sequence[int]) -> bool:
        """Write the state holding ``tokens`` to disk now (a save by hand); False: none is,
        or the disk tier is off."""
        ids = as_tokens(tokens)
        with self._lock:
            states = self._index.get((model, tenant))
            found = states.starting_with(ids) if states is not None else []
        if not found:
            return False
        entry, data = found[0], found[0].data
        if entry.path is None and data is not None:
            self._write(entry, data)
        return entry.path is not None

    def flush(self) -> None:
        """Write every state that is only in RAM to disk (the next process finds them)."""
        self.wait_for_writes()
        with self._lock:
            pending = [e for e in self._all() if e.data is not None and e.path is None]
        for entry in sorted(pending, key=lambda e: -e.last_used_s):  # most useful first
            if entry.data is not None:
                self._write(entry, entry.data)

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writes.put(_STOP)
            self._writer.join()
            self._writer = None
