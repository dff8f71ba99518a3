"""Keys file, tenants, limits and the gate in front of the routes."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest

from homelab.errors import ConfigError
from homelab.server.auth import (
    KeyFile,
    KeyRing,
    RateLimited,
    Tenant,
    TenantLimiter,
    TenantLimits,
    add_key,
    hash_key,
    load_keys,
    remove_keys,
)
from homelab.server.middleware import TENANT_KEY, TenantGate


def test_add_key_stores_only_the_hash_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "config" / "keys.toml"
    key = add_key(path, "alice", admin=True)
    second = add_key(path, "bob")
    text = path.read_text()
    assert key not in text and second not in text
    assert hash_key(key) in text and hash_key(second) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ring = load_keys(path)
    alice, bob = ring.authenticate(key), ring.authenticate(second)
    assert alice is not None and alice.name == "alice" and alice.admin
    assert bob is not None and bob.name == "bob" and not bob.admin
    assert ring.authenticate("hl-not-a-key") is None


def test_keys_file_with_limits(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(
        f'[keys]\n"{hash_key("k1")}" = "team"\n"{hash_key("k2")}" = "team"\n\n'
        "[tenants.team]\nmax_concurrent_requests = 2\nrequests_per_minute = 30\n"
    )
    ring = load_keys(path)
    team = ring.authenticate("k2")
    assert team == Tenant(
        "team", False, TenantLimits(max_concurrent_requests=2, requests_per_minute=30)
    )
    assert ring.authenticate("k1") == team


def test_a_name_given_again_is_a_new_identity(tmp_path: Path) -> None:
    """The identity keys slots, prompt states and stored responses: a second key of the same
    holder keeps it; removing the tenant's keys and adding one again makes a new one."""
    path = tmp_path / "keys.toml"
    first = add_key(path, "alice")
    second = add_key(path, "alice")
    ring = load_keys(path)
    old, also = ring.authenticate(first), ring.authenticate(second)
    assert old is not None and also is not None and old.identity == also.identity
    assert old.identity.startswith("alice#") and old.generation in path.read_text()
    assert remove_keys(path, "alice").identity == old.identity
    assert load_keys(path).authenticate(first) is None and "alice" not in path.read_text()
    new_key = add_key(path, "alice")
    new = load_keys(path).authenticate(new_key)
    assert new is not None and new.name == "alice" and new.identity != old.identity
    with pytest.raises(ConfigError, match="no tenant 'carol'"):
        remove_keys(path, "carol")


def test_a_keys_file_from_before_keeps_its_names_as_identities(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[keys]\n"{hash_key("k1")}" = "team"\n')
    ring = load_keys(path)
    team = ring.authenticate("k1")
    assert team is not None and team.identity == "team"  # its saved states stay its own
    add_key(path, "team")  # not its first key: no new generation
    again = load_keys(path).authenticate("k1")
    assert again is not None and again.identity == "team"


def test_a_running_server_sees_keys_added_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    alice_key, bob_key = add_key(path, "alice"), add_key(path, "bob")
    keys = KeyFile(path, check_every_s=0)
    gone: list[str] = []
    keys.on_removed.append(lambda tenants: gone.extend(t.identity for t in tenants))
    alice = keys.authenticate(alice_key)
    assert alice is not None
    carol_key = add_key(path, "carol")
    remove_keys(path, "alice")
    assert keys.authenticate(carol_key) is not None  # the file is read again
    assert keys.authenticate(alice_key) is None and gone == [alice.identity]
    path.write_text("[keys\n")  # broken: the keys loaded before stay
    assert keys.authenticate(bob_key) is not None and gone == [alice.identity]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("[keys\n", "not valid TOML"),
        ('[keys]\n"abc" = "x"\n', "not a SHA-256"),
        (f'[keys]\n"{"0" * 64}" = "bad name!"\n', "tenant names"),
        ("[tenants.x]\nmax_concurrent_requests = -1\n", "non-negative"),
        ("[tenants.x]\nburst = 3\n", "unknown keys"),
        ("[users]\n", "unknown section"),
    ],
)
def test_bad_keys_files_name_the_file(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_keys(path)
    assert str(path) in str(error.value) and problem in str(error.value)


def test_concurrency_limit_and_release() -> None:
    limiter = TenantLimiter()
    tenant = Tenant("t", limits=TenantLimits(max_concurrent_requests=2))
    first, _ = limiter.acquire(tenant), limiter.acquire(tenant)
    with pytest.raises(RateLimited):
        limiter.acquire(tenant)
    first()
    first()  # releasing twice frees one slot only
    limiter.acquire(tenant)
    with pytest.raises(RateLimited):
        limiter.acquire(tenant)


def test_requests_per_minute_refills_over_time() -> None:
    now = [100.0]
    limiter = TenantLimiter(clock=lambda: now[0])
    tenant = Tenant("t", limits=TenantLimits(max_concurrent_requests=0, requests_per_minute=6))
    for _ in range(6):
        limiter.acquire(tenant)()
    with pytest.raises(RateLimited) as limited:
        limiter.acquire(tenant)
    assert limited.value.retry_after_s == 10  # one request per 10 s
    now[0] += 10
    limiter.acquire(tenant)


def test_other_tenants_are_not_limited_by_one_tenant() -> None:
    limiter = TenantLimiter()
    busy = Tenant("busy", limits=TenantLimits(max_concurrent_requests=1))
    limiter.acquire(busy)
    limiter.acquire(Tenant("calm", limits=TenantLimits(max_concurrent_requests=1)))


def test_a_name_given_to_someone_new_does_not_inherit_the_old_holders_limits() -> None:
    limiter = TenantLimiter()
    limits = TenantLimits(max_concurrent_requests=1, requests_per_minute=1)
    limiter.acquire(Tenant("bob", limits=limits, generation="g1"))  # still in flight
    with pytest.raises(RateLimited):
        limiter.acquire(Tenant("bob", limits=limits, generation="g1"))
    limiter.acquire(Tenant("bob", limits=limits, generation="g2"))  # the name's new holder


def test_each_identity_has_one_preparation_lane_of_one_thread() -> None:
    async def lanes() -> list[Any]:
        limiter = TenantLimiter()
        return [
            limiter.preparation_lane(Tenant("bob", generation="g1")),
            limiter.preparation_lane(Tenant("bob", generation="g1")),
            limiter.preparation_lane(Tenant("bob", generation="g2")),
            limiter.preparation_lane(Tenant("carol")),
        ]

    first, again, new_holder, other = anyio.run(lanes)
    assert first is again and first.total_tokens == 1
    assert new_holder is not first and other is not first and other is not new_holder


# --- the gate, as an ASGI layer -------------------------------------------------------------


def run_gate(
    gate_path: str, headers: dict[str, str], client_host: str, bound_to_loopback: bool
) -> tuple[int, Any]:
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen["tenant"] = scope.get(TENANT_KEY)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    ring = KeyRing.from_keys({"admin-key": Tenant("ops", admin=True), "user-key": Tenant("u")})
    gate = TenantGate(app, keys=ring, limiter=TenantLimiter(), bound_to_loopback=bound_to_loopback)
    scope = {
        "type": "http",
        "method": "GET",
        "path": gate_path,
        "query_string": b"",
        "client": (client_host, 50000),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    asyncio.run(gate(scope, receive, send))
    return sent[0]["status"], seen.get("tenant")


def test_metrics_need_an_admin_key_unless_local() -> None:
    user, admin = {"Authorization": "Bearer user-key"}, {"Authorization": "Bearer admin-key"}
    assert run_gate("/metrics", user, "203.0.113.9", bound_to_loopback=False)[0] == 403
    assert run_gate("/metrics", {}, "203.0.113.9", bound_to_loopback=False)[0] == 401
    assert run_gate("/metrics", admin, "203.0.113.9", bound_to_loopback=False)[0] == 200
    assert run_gate("/metrics", {}, "127.0.0.1", bound_to_loopback=True)[0] == 200
    assert run_gate("/metrics", user, "127.0.0.1", bound_to_loopback=False)[0] == 403


def test_gate_sets_the_tenant_from_the_key_only() -> None:
    status, tenant = run_gate("/v1/models", {"Authorization": "bearer user-key"}, "127.0.0.1", True)
    assert status == 200 and tenant == Tenant("u")
