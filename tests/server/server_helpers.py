"""Constants and helpers shared by the server tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

import httpx

from homelab.server.auth import KeyRing, Tenant, TenantLimits

MODEL_ID = "tiny"
ALICE_KEY = "hl-test-alice-key"
BOB_KEY = "hl-test-bob-key"
ADMIN_KEY = "hl-test-admin-key"
# tenants that only the isolation tests use, each for one first-ever request
FRESH_KEYS = {name: f"hl-test-{name}-key" for name in ("carol", "dave", "erin", "frank")}
N_CTX_PER_SLOT = 512
N_SLOTS = 4


def make_keys() -> KeyRing:
    return KeyRing.from_keys(
        {
            ALICE_KEY: Tenant("alice", limits=TenantLimits(max_concurrent_requests=32)),
            BOB_KEY: Tenant("bob", limits=TenantLimits(max_concurrent_requests=32)),
            ADMIN_KEY: Tenant("ops", admin=True),
            **{key: Tenant(name) for name, key in FRESH_KEYS.items()},
        }
    )


def alice_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ALICE_KEY}"}


def assert_still_serving(http: httpx.Client) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = http.post("/v1/chat/completions", json=body, headers=alice_headers())
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1
