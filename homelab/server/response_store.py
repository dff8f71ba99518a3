"""Stored responses (``store``, ``previous_response_id``, ``GET``/``DELETE /v1/responses/{id}``).

Codex and other Responses clients continue a conversation by naming the previous response
instead of resending it. A response is kept with the input items it answered, so the next
request's input is ``stored items + output items + new input``. The store is:

- **per tenant**: a response is found only with the key of the tenant that made it; any other
  tenant's lookup is the same 404 as an unknown id (nothing says the id exists);
- **bounded**: at most ``max_entries`` responses and ``max_bytes`` bytes (their JSON size) for
  all tenants together, the oldest dropped first, and none older than ``ttl_s``.

Everything runs on the event loop (no lock): lookups and inserts are a few dict operations.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from homelab.server.errors import ApiError


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
    """Responses by (tenant, id), oldest first."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tenant: str, response: dict[str, Any], input_items: list[Any]) -> None:
        """Keep ``response`` (which answered ``input_items``) unless it alone is too big."""
        size = len(json.dumps([response, input_items], ensure_ascii=False).encode())
        if size > self.max_bytes or self.max_entries < 1:
            return
        key = (tenant, str(response["id"]))
        self._drop(key)
        self._entries[key] = StoredResponse(response, input_items, size, self._clock())
        self.total_bytes += size
        self._expire()
        while len(self._entries) > self.max_entries or self.total_bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def get(self, tenant: str, response_id: str, param: str | None = None) -> StoredResponse:
        """The tenant's stored response, or a 404 (also for another tenant's id)."""
        self._expire()
        entry = self._entries.get((tenant, response_id))
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
        self._drop((tenant, response_id))

    def _expire(self) -> None:
        deadline = self._clock() - self.ttl_s
        while self._entries:
            key, oldest = next(iter(self._entries.items()))
            if oldest.stored_at_s > deadline:
                return
            self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.total_bytes -= entry.size_bytes


def input_items(value: Any) -> list[Any]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []
