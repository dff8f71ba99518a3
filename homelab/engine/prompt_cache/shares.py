"""Each tenant's share of a budget, and the order room is made in.

The prompt cache's RAM budget and disk cap are shared by every tenant, but not first come,
first served: each tenant has a share (``tenant_share``: a quarter by default). A tenant may
use more while there is room — one tenant alone gets the whole cache — but when room must be
made, the states that go first are the least recently used of the tenant most over its share.
One tenant saving state after state then pushes out only its own; another tenant's states,
within their share, stay. When no tenant is over its share, the least recently used of all go.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping

from homelab.engine.prompt_cache.entry import StateEntry


def share_bytes(total_bytes: int, tenant_share: float) -> int:
    """A tenant's share of ``total_bytes`` (at least one byte)."""
    return max(1, int(total_bytes * tenant_share))


def victims(
    candidates: Iterable[StateEntry],
    usage: Mapping[str, int],
    share: int,
    size: Callable[[StateEntry], int],
) -> Iterator[StateEntry]:
    """``candidates`` in the order room is made: the least recently used state of the tenant
    most over its ``share`` (``usage``: bytes per tenant, counting what is about to be added),
    one at a time; once none is over, the least recently used of all."""
    queues: dict[str, deque[StateEntry]] = {}
    for entry in sorted(candidates, key=lambda e: e.last_used_s):
        queues.setdefault(entry.tenant, deque()).append(entry)
    used = dict(usage)
    while queues:
        tenant = _most_over(queues, used, share) or min(
            queues, key=lambda t: queues[t][0].last_used_s
        )
        victim = queues[tenant].popleft()
        if not queues[tenant]:
            del queues[tenant]
        used[tenant] = used.get(tenant, 0) - size(victim)
        yield victim


def _most_over(queues: Mapping[str, deque[StateEntry]], used: Mapping[str, int], share: int) -> str:
    """The tenant (with a state left to give) furthest over its share; "" when none is."""
    over = {tenant: used.get(tenant, 0) - share for tenant in queues}
    tenant = max(over, key=lambda t: over[t], default="")
    return tenant if tenant and over[tenant] > 0 else ""
