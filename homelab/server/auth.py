"""API keys, tenants and per-tenant limits.

The keys file (``config_dir()/keys.toml``, mode 0600) stores only SHA-256 hashes of keys:

    [keys]
    "<sha256 hex of the key>" = "alice"
    "<sha256 hex of another key>" = "bob"

    [tenants.alice]                # optional; defaults below
    max_concurrent_requests = 4    # default 32; 0 = unlimited
    requests_per_minute = 120      # 0 = unlimited
    admin = true                   # may read /metrics from anywhere
    generation = "5f0c2a9e81d4"    # written when the name gets its first key

A presented key is hashed and compared with *every* stored hash using
``hmac.compare_digest``, so neither the comparison nor an early exit leaks how close a
guess was. The tenant a key maps to drives the limits enforced by :class:`TenantLimiter`;
its **identity** (``Tenant.identity``: the name and its generation) keys everything the
server keeps for it — slots, saved prompt states, stored responses. A name whose last key
was removed and that is given a key again gets a new generation, so the new holder finds
nothing of the old one's (``cached_tokens`` cannot answer "was this their prompt?").

A running server re-reads its keys file when it changes (:class:`KeyFile`): a new key works
at once, a removed one stops working, and the caches of a tenant whose last key went are
deleted (``homelab serve --remove-keys TENANT`` removes them all).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import re
import secrets
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from homelab.engine.prompt_cache.key import tenant_identity
from homelab.errors import ConfigError
from homelab.locations import config_dir, ensure_dir

log = logging.getLogger("homelab.server")

PREPARATION_LANE_KEY = "homelab.preparation_lane"  # the scope's TenantLimiter.preparation_lane
KEYS_FILE_NAME = "keys.toml"
KEY_PREFIX = "hl-"
LOCAL_TENANT = "local"
_HASH_PATTERN = re.compile(r"^[0-9a-f]{64}$")
_TENANT_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_GENERATION_PATTERN = re.compile(r"^[0-9a-f]{1,32}$")
GENERATION_BYTES = 6
KEYS_CHECK_S = 1.0  # how often a running server looks at its keys file


@dataclass(frozen=True)
class TenantLimits:
    max_concurrent_requests: int = 32  # 0 = unlimited
    requests_per_minute: int = 0  # 0 = unlimited


@dataclass(frozen=True)
class Tenant:
    name: str
    admin: bool = False
    limits: TenantLimits = field(default_factory=TenantLimits)
    generation: str = ""  # given with the name's first key ("": a keys file from before)

    @property
    def identity(self) -> str:
        """Whose slots, prompt states and stored responses these are (name + generation)."""
        return tenant_identity(self.name, self.generation)


def default_keys_path() -> Path:
    return config_dir() / KEYS_FILE_NAME


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class KeyRing:
    """Key hashes -> tenants, loaded from a keys file."""

    key_hashes: tuple[tuple[bytes, str], ...]  # (sha256 digest, tenant name)
    tenants: Mapping[str, Tenant]
    source: str = "<memory>"

    @classmethod
    def from_keys(cls, keys: Mapping[str, Tenant]) -> KeyRing:
        """A key ring from plaintext keys (tests, ``start_server``)."""
        hashes = tuple((hashlib.sha256(k.encode()).digest(), t.name) for k, t in keys.items())
        tenants = {t.name: t for t in keys.values()}
        return cls(hashes, tenants)

    def authenticate(self, presented_key: str) -> Tenant | None:
        presented = hashlib.sha256(presented_key.encode()).digest()
        found: str | None = None
        for stored, tenant_name in self.key_hashes:  # no early exit: constant work per key
            if hmac.compare_digest(stored, presented):
                found = tenant_name
        return None if found is None else self.tenants[found]

    def __len__(self) -> int:
        return len(self.key_hashes)

    def holders(self) -> dict[str, Tenant]:
        """The tenants that have at least one key, by identity."""
        names = {name for _, name in self.key_hashes}
        return {t.identity: t for t in self.tenants.values() if t.name in names}


def load_keys(path: Path) -> KeyRing:
    """Parse a keys file; every problem is a ConfigError naming the file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the keys file ({exc.strerror}).") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid TOML ({exc}).", hint="Fix or delete the file."
        ) from exc
    return _parse_keys(data, str(path))


def _parse_keys(data: Mapping[str, object], source: str) -> KeyRing:
    unknown = set(data) - {"keys", "tenants"}
    if unknown:
        raise ConfigError(
            f"{source}: unknown section(s) {sorted(unknown)}; expected [keys], [tenants.*]."
        )
    keys = data.get("keys", {})
    tenant_tables = data.get("tenants", {})
    if not isinstance(keys, dict) or not isinstance(tenant_tables, dict):
        raise ConfigError(f"{source}: [keys] and [tenants] must be tables.")
    hashes = tuple(_parse_key_entry(source, key_hash, tenant) for key_hash, tenant in keys.items())
    names = {name for _, name in hashes} | set(tenant_tables)
    tenants = {name: _parse_tenant(source, name, tenant_tables.get(name, {})) for name in names}
    return KeyRing(hashes, tenants, source)


def _parse_key_entry(source: str, key_hash: str, tenant: object) -> tuple[bytes, str]:
    if not _HASH_PATTERN.match(key_hash):
        raise ConfigError(
            f"{source}: {key_hash[:16]!r}… is not a SHA-256 hex digest.",
            hint="Keys are stored hashed: use `homelab serve --new-key TENANT` to add one.",
        )
    if not isinstance(tenant, str) or not _TENANT_PATTERN.match(tenant):
        raise ConfigError(f"{source}: tenant names must be 1-64 letters, digits, '_', '.' or '-'.")
    return bytes.fromhex(key_hash), tenant


def _parse_tenant(source: str, name: str, table: object) -> Tenant:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [tenants.{name}] must be a table.")
    allowed = {"max_concurrent_requests", "requests_per_minute", "admin", "generation"}
    if set(table) - allowed:
        raise ConfigError(
            f"{source}: [tenants.{name}] has unknown keys {sorted(set(table) - allowed)}."
        )
    limits = TenantLimits(
        max_concurrent_requests=_non_negative(source, name, table, "max_concurrent_requests", 32),
        requests_per_minute=_non_negative(source, name, table, "requests_per_minute", 0),
    )
    admin = table.get("admin", False)
    if not isinstance(admin, bool):
        raise ConfigError(f"{source}: [tenants.{name}] admin must be true or false.")
    generation = table.get("generation", "")
    if generation and not (isinstance(generation, str) and _GENERATION_PATTERN.match(generation)):
        raise ConfigError(
            f"{source}: [tenants.{name}] generation must be hex digits.",
            hint="It is written with the tenant's first key; delete the line to keep the name's"
            " old caches, or remove the tenant's keys and add a new one.",
        )
    return Tenant(name, admin, limits, str(generation))


def _non_negative(source: str, name: str, table: dict[str, object], key: str, default: int) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{source}: [tenants.{name}] {key} must be a non-negative integer.")
    return value


def add_key(path: Path, tenant: str, *, admin: bool = False) -> str:
    """Create a key for ``tenant``, add its hash to the keys file (0600) and return it.

    The key itself is stored nowhere: the caller shows it once. A tenant's first key gives
    it a new generation (a new identity: nothing of a former holder of the name is found).
    """
    if not _TENANT_PATTERN.match(tenant):
        raise ConfigError(f"tenant name {tenant!r} must be 1-64 letters, digits, '_', '.' or '-'.")
    ring = load_keys(path) if path.exists() else KeyRing((), {})
    key = generate_key()
    tenants = dict(ring.tenants)
    previous = tenants.get(tenant, Tenant(tenant))
    has_keys = any(name == tenant for _, name in ring.key_hashes)
    generation = previous.generation if has_keys else secrets.token_hex(GENERATION_BYTES)
    tenants[tenant] = replace(previous, admin=admin or previous.admin, generation=generation)
    hashes = (*ring.key_hashes, (hashlib.sha256(key.encode()).digest(), tenant))
    write_keys(path, KeyRing(hashes, tenants))
    return key


def remove_keys(path: Path, tenant: str) -> Tenant:
    """Remove every key of ``tenant`` (and its table) from the keys file; the tenant as it
    was (its identity names the caches to delete)."""
    ring = load_keys(path) if path.exists() else KeyRing((), {})
    if tenant not in ring.tenants:
        known = ", ".join(sorted(ring.tenants)) or "none"
        raise ConfigError(
            f"{path}: there is no tenant {tenant!r} (tenants: {known}).",
            hint="Check the name; `homelab serve --new-key TENANT` adds one.",
        )
    hashes = tuple((digest, name) for digest, name in ring.key_hashes if name != tenant)
    tenants = {name: t for name, t in ring.tenants.items() if name != tenant}
    write_keys(path, KeyRing(hashes, tenants))
    return ring.tenants[tenant]


def write_keys(path: Path, ring: KeyRing) -> None:
    """Write the keys file atomically, readable by its owner only."""
    lines = [
        "# homelab API keys: sha256(key) -> tenant. Keys themselves are never stored.",
        "[keys]",
    ]
    lines += [f'"{digest.hex()}" = "{name}"' for digest, name in ring.key_hashes]
    for tenant in sorted(ring.tenants.values(), key=lambda t: t.name):
        lines += [
            "",
            f'[tenants."{tenant.name}"]',
            f"max_concurrent_requests = {tenant.limits.max_concurrent_requests}",
            f"requests_per_minute = {tenant.limits.requests_per_minute}",
            f"admin = {'true' if tenant.admin else 'false'}",
        ]
        if tenant.generation:
            lines.append(f'generation = "{tenant.generation}"')
    ensure_dir(path.parent, private=True)
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(partial, path)


class KeyFile:
    """A keys file as a running server sees it: re-read when it changes (looked at no more
    than every ``check_every_s``, when a key is presented). A key added works at once and a
    key removed stops working, without a restart. The tenants whose last key went are passed
    to every ``on_removed`` callback (the server deletes what it keeps for them). A file that
    cannot be read any more leaves the keys loaded before in force, with a warning."""

    def __init__(
        self,
        path: Path,
        check_every_s: float = KEYS_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.ring = load_keys(path)
        self.check_every_s = check_every_s
        self.on_removed: list[Callable[[list[Tenant]], None]] = []
        self._clock = clock
        self._signature = _signature(path)
        self._next_check_s = clock() + check_every_s

    @property
    def tenants(self) -> Mapping[str, Tenant]:
        return self.ring.tenants

    def __len__(self) -> int:
        return len(self.ring)

    def authenticate(self, presented_key: str) -> Tenant | None:
        self.refresh()
        return self.ring.authenticate(presented_key)

    def refresh(self) -> None:
        """Re-read the file if it changed since it was last read (and it is time to look)."""
        now = self._clock()
        if now < self._next_check_s:
            return
        self._next_check_s = now + self.check_every_s
        signature = _signature(self.path)
        if signature == self._signature:
            return
        self._signature = signature
        try:
            ring = load_keys(self.path)
        except ConfigError as exc:
            log.warning("keys file changed but unreadable (%s); the keys loaded before stay", exc)
            return
        before, after = self.ring.holders(), ring.holders()
        self.ring = ring
        removed = [tenant for identity, tenant in before.items() if identity not in after]
        if removed:
            log.info("keys file: no key left for %s", ", ".join(t.name for t in removed))
            for callback in self.on_removed:
                callback(removed)


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


Keys = KeyRing | KeyFile  # what the server authenticates with


# --- limits ---------------------------------------------------------------------------------


@dataclass
class _TenantState:
    in_flight: int = 0
    tokens: float = 0.0
    refilled_at: float = 0.0
    lane: anyio.CapacityLimiter | None = None  # see TenantLimiter.preparation_lane


class RateLimited(Exception):
    def __init__(self, reason: str, retry_after_s: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class TenantLimiter:
    """Per-tenant concurrency and requests-per-minute (token bucket) limits, kept per identity:
    a name given to someone new starts with an empty count and a full bucket.

    Used from one event loop, so no locking is needed.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[str, _TenantState] = {}

    def acquire(self, tenant: Tenant) -> Callable[[], None]:
        """Admit a request or raise :class:`RateLimited`; returns the release function."""
        state = self._states.setdefault(tenant.identity, _TenantState())
        limits = tenant.limits
        if limits.max_concurrent_requests and state.in_flight >= limits.max_concurrent_requests:
            raise RateLimited(
                f"Too many concurrent requests for this key (limit "
                f"{limits.max_concurrent_requests}). Retry when one finishes.",
                retry_after_s=1,
            )
        if limits.requests_per_minute:
            self._take_token(state, limits.requests_per_minute)
        state.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                state.in_flight -= 1

        return release

    def preparation_lane(self, tenant: Tenant) -> anyio.CapacityLimiter:
        """One worker thread at a time for this tenant's long preparations (a big body's
        parse, a long conversation's conversion and rendering): Python work that holds the
        GIL, so a tenant sending many at once would starve every other request, ``/health``
        included (issue 39's soak: p99 408 ms). Created in the event loop (the gate)."""
        state = self._states.setdefault(tenant.identity, _TenantState())
        if state.lane is None:
            state.lane = anyio.CapacityLimiter(1)
        return state.lane

    def _take_token(self, state: _TenantState, per_minute: int) -> None:
        now = self._clock()
        rate_per_s = per_minute / 60.0
        if state.refilled_at == 0.0:
            state.tokens, state.refilled_at = float(per_minute), now
        state.tokens = min(float(per_minute), state.tokens + (now - state.refilled_at) * rate_per_s)
        state.refilled_at = now
        if state.tokens < 1.0:
            wait_s = math.ceil((1.0 - state.tokens) / rate_per_s)
            raise RateLimited(
                f"Rate limit reached for this key ({per_minute} requests per minute).",
                retry_after_s=max(1, wait_s),
            )
        state.tokens -= 1.0
