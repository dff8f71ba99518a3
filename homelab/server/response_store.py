"""Stored responses (``store``, ``previous_response_id``, ``GET``/``DELETE /v1/responses/{id}``).

Codex and other Responses clients continue a conversation by naming the previous response
instead of resending it. A response is kept with the input items it answered, so the next
request's input is ``stored items + output items + new input``. The store is:

- **per tenant**: a response is found only with the key of the tenant that made it (its
  identity: a name re-given to a new key holder finds nothing of the old one's); any other
  tenant's lookup is the same 404 as an unknown id (nothing says the id exists);
- **bounded**: at most ``max_entries`` responses and ``max_bytes`` bytes (their JSON size) for
  all tenants together, none older than ``ttl_s``;
- **shared fairly**: each tenant has a share of both bounds (``tenant_share``, a quarter by
  default: 64 responses, 16 MiB). A tenant may use more while there is room, but when the store
  is full the response dropped is the oldest of the tenant most over its share — so one
  tenant filling the store drops only its own oldest responses, never another's within its
  share. (A hard cap per tenant would leave a server with one tenant, the usual ``local``, a
  quarter of its store.)

Everything runs on the event loop (no lock): lookups and inserts are a few dict operations.
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from homelab.server.errors import ApiError

DEFAULT_TENANT_SHARE = 0.25


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as the client received it
    input_items: list[Any]  # every input item it answered (earlier responses' included)
    size_bytes: int
    stored_at_s: float

    @property
    def items(self) -> list[Any]:
        """The conversation so far: its input items, then its output items."""
        return [*self.input_items, *self.response.get("output", [])]


class ResponseStore:
    """Responses by tenant, then id, each tenant's oldest first."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl_s: float,
        tenant_share: float = DEFAULT_TENANT_SHARE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.share_entries = max(1, math.ceil(max_entries * tenant_share))
        self.share_bytes = max(1, math.ceil(max_bytes * tenant_share))
        self._clock = clock
        self._tenants: dict[str, OrderedDict[str, StoredResponse]] = {}
        self._tenant_bytes: dict[str, int] = {}

    def __len__(self) -> int:
        return sum(len(responses) for responses in self._tenants.values())

    @property
    def total_bytes(self) -> int:
        return sum(self._tenant_bytes.values())

    def put(self, tenant: str, response: dict[str, Any], input_items: list[Any]) -> None:
        """Keep ``response`` (which answered ``input_items``) unless it alone is too big."""
        size = len(json.dumps([response, input_items], ensure_ascii=False).encode())
        if size > self.max_bytes or self.max_entries < 1:
            return
        response_id = str(response["id"])
        self._drop(tenant, response_id)
        entry = StoredResponse(response, input_items, size, self._clock())
        self._tenants.setdefault(tenant, OrderedDict())[response_id] = entry
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size
        self._expire()
        while len(self) > self.max_entries or self.total_bytes > self.max_bytes:
            victim = self._most_over_share()
            self._drop(victim, next(iter(self._tenants[victim])))

    def get(self, tenant: str, response_id: str, param: str | None = None) -> StoredResponse:
        """The tenant's stored response, or a 404 (also for another tenant's id)."""
        self._expire()
        responses = self._tenants.get(tenant)
        entry = responses.get(response_id) if responses is not None else None
        if entry is None:
            raise ApiError(
                404,
                f"No response with id '{response_id}' is stored on this server (responses "
                f"are kept {self.ttl_s:.0f} s at most, for the key that made them).",
                param=param,
                code="response_not_found",
            )
        return entry

    def delete(self, tenant: str, response_id: str) -> None:
        self.get(tenant, response_id)
        self._drop(tenant, response_id)

    def drop_tenant(self, tenant: str) -> int:
        """Forget every response of ``tenant`` (its last key is gone); how many."""
        self._tenant_bytes.pop(tenant, None)
        return len(self._tenants.pop(tenant, ()))

    def tenant_usage(self, tenant: str) -> tuple[int, int]:
        """How many responses ``tenant`` has stored, and their bytes."""
        return len(self._tenants.get(tenant, ())), self._tenant_bytes.get(tenant, 0)

    def _most_over_share(self) -> str:
        """The tenant furthest beyond its share (in responses or bytes, whichever is more)."""

        def over(tenant: str) -> float:
            n_entries, n_bytes = self.tenant_usage(tenant)
            return max(n_entries / self.share_entries, n_bytes / self.share_bytes)

        def oldest_s(tenant: str) -> float:
            return next(iter(self._tenants[tenant].values())).stored_at_s

        return max(self._tenants, key=lambda tenant: (over(tenant), -oldest_s(tenant)))

    def _expire(self) -> None:
        deadline = self._clock() - self.ttl_s
        for tenant in list(self._tenants):
            responses = self._tenants[tenant]
            while responses:
                response_id, oldest = next(iter(responses.items()))
                if oldest.stored_at_s > deadline:
                    break
                self._drop(tenant, response_id)

    def _drop(self, tenant: str, response_id: str) -> None:
        responses = self._tenants.get(tenant)
        entry = responses.pop(response_id, None) if responses is not None else None
        if entry is None:
            return
        self._tenant_bytes[tenant] -= entry.size_bytes
        if not responses:
            del self._tenants[tenant], self._tenant_bytes[tenant]


def input_items(value: Any) -> list[Any]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []
