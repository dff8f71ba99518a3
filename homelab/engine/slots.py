"""Slots (llama.cpp sequences) and the tenant-isolated prefix cache.

A slot is one llama.cpp sequence id with its own part of the KV cache. It remembers the
tokens whose keys and values it holds and the tenant that produced them. A new request is
placed in the free slot holding the longest common prefix **from the same tenant**, and only
the rest of its prompt is evaluated — unless its prompt diverges from the slot early enough
to drop more than half of what the slot holds while another slot is free (a short probe
beside a long conversation): the tenant's largest cache is kept and the request takes, of the
other free slots, the one whose cache loses the fewest tokens. A slot last used by another
tenant is always cleared before it is handed over, so one tenant's cache never speeds up (and
so never reveals anything to) another.
:meth:`SlotTable.acquire` is the only way to take a slot, and it enforces that rule.

Recurrent models (Mamba, RWKV, hybrids) cannot drop part of their state, so prefix reuse is
off for them: every request clears its slot. Sliding-window models keep only the last
``n_swa`` positions when ``swa_full`` is off; a prefix is reused only if the window it needs
is still in the cache (the same test llama-server makes).

A request that does not continue its own slot (nothing reusable, or a probe kept off a
conversation) takes, with a cache stream per slot (``contiguous``), a free slot that keeps
the busy ones in the fewest runs of consecutive ids: llama.cpp computes a step in one graph
only over such a run and splits it at every gap (four generating sequences in slots 0, 5, 9,
14 took 1.7x the time of four in slots 0-3 here; on a GPU each extra graph reads the weights
again). Among equals, the rules above: the cache that loses least, an empty slot, the least
recently used.

With a prompt cache (``homelab.engine.prompt_cache``) the table has a :class:`StateKeeper`:
a slot about to be cleared or cut short is saved first, and a placed request gets the
tenant's longest saved prefix restored when that beats what the slot already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from homelab.llamacpp.memory import SequenceMemory


@dataclass
class Slot:
    seq_id: int
    tenant: str | None = None  # who produced the cached tokens; None = empty
    tokens: list[int] = field(default_factory=list)  # tokens whose K/V are in the cache
    busy: bool = False
    last_used: int = 0  # a counter, larger = more recent
    # its tenant's caches were cleared while it served: emptied when released, never saved
    erase_on_release: bool = False


@dataclass(frozen=True)
class SlotState:
    """A slot as the TUI and tests see it (read on the engine thread)."""

    seq_id: int
    tenant: str | None
    busy: bool
    cached_tokens: int  # tokens the slot remembers
    kv_pos_min: int  # llama.cpp's view of the sequence: -1 when empty
    kv_pos_max: int


@dataclass(frozen=True)
class Placement:
    slot: Slot
    n_cached: int  # prompt tokens already in the slot's cache (evaluate the rest)


class StateKeeper(Protocol):
    """Saves slots before they lose tokens and restores saved prefixes (the prompt cache)."""

    def before_loss(self, slot: Slot, n_keep: int) -> None: ...

    def save(self, slot: Slot) -> bool: ...

    def restore(self, slot: Slot, prompt: Sequence[int], n_cached: int) -> int: ...


def common_prefix_length(first: Sequence[int], second: Sequence[int]) -> int:
    limit = min(len(first), len(second))
    index = 0
    while index < limit and first[index] == second[index]:
        index += 1
    return index


class SlotTable:
    """Chooses, clears and releases slots; owns the prefix-cache policy."""

    def __init__(
        self,
        n_slots: int,
        memory: SequenceMemory,
        *,
        prefix_reuse: bool,
        n_swa: int,
        contiguous: bool = False,
    ) -> None:
        self.slots = [Slot(seq_id) for seq_id in range(n_slots)]
        self._memory = memory
        self.prefix_reuse = prefix_reuse
        self._n_swa = n_swa
        self._contiguous = contiguous  # a cache stream per slot: keep busy slots in a run
        self._clock = 0
        self.keeper: StateKeeper | None = None  # the prompt cache, when the engine has one

    @property
    def n_free(self) -> int:
        return sum(not slot.busy for slot in self.slots)

    @property
    def n_busy(self) -> int:
        return len(self.slots) - self.n_free

    def states(self) -> tuple[SlotState, ...]:
        memory = self._memory
        return tuple(
            SlotState(
                slot.seq_id,
                slot.tenant,
                slot.busy,
                len(slot.tokens),
                memory.first_position(slot.seq_id),
                memory.last_position(slot.seq_id),
            )
            for slot in self.slots
        )

    def cells_used(self) -> int:
        return sum(len(slot.tokens) for slot in self.slots)

    def acquire(self, tenant: str, prompt: Sequence[int]) -> Placement | None:
        """Take the best free slot for ``tenant`` (None when all are busy)."""
        free = [slot for slot in self.slots if not slot.busy]
        if not free:
            return None
        slot, n_reusable = self._best_same_tenant(free, tenant, prompt)
        if slot is not None and len(free) > 1 and self._cuts_short(slot, n_reusable, prompt):
            free = self._unprotected(free, tenant)  # nor taken below when nothing is reusable
            slot, n_reusable = self._cheapest(free, tenant, prompt)
        if slot is None or n_reusable == 0:
            slot, n_reusable = self._least_valuable(free), 0
        n_cached = self._keep(slot, tenant, n_reusable)
        slot.busy = True
        slot.tenant = tenant
        self._clock += 1
        slot.last_used = self._clock
        if self.keeper is not None:
            try:
                n_cached = self._restored(slot, prompt, n_cached)
            except BaseException:  # the request never got the slot: it must not stay busy
                self.clear(slot)  # a restore may have half-written its cache
                slot.busy = False
                raise
        return Placement(slot, n_cached)

    def _restored(self, slot: Slot, prompt: Sequence[int], n_cached: int) -> int:
        """Let the prompt cache fill the slot with more of ``prompt`` than it holds."""
        assert self.keeper is not None
        n_usable = self.keeper.restore(slot, prompt, n_cached)
        return n_cached if n_usable == n_cached else self._trim(slot, n_usable)

    def _best_same_tenant(
        self, free: list[Slot], tenant: str, prompt: Sequence[int]
    ) -> tuple[Slot | None, int]:
        if not self.prefix_reuse:
            return None, 0
        best, best_length = None, 0
        for slot in free:
            if slot.tenant != tenant:
                continue
            # at least one prompt token is evaluated, to get logits for the first sample
            length = min(common_prefix_length(slot.tokens, prompt), len(prompt) - 1)
            if length > best_length:
                best, best_length = slot, length
        return best, best_length

    @staticmethod
    def _cuts_short(slot: Slot, n_reusable: int, prompt: Sequence[int]) -> bool:
        """Reusing ``slot`` would drop most of what it holds for a few shared tokens: a short
        probe (a title, a quota check) beside an agent's long conversation sharing only the
        start of the system prompt. Another free slot serves it, and the conversation keeps
        its cache for its next turn. A prompt the slot holds whole (the same question again)
        diverges nowhere: it reuses the slot."""
        diverges = n_reusable < len(prompt) - 1  # the last prompt token is always evaluated
        return diverges and n_reusable * 2 < len(slot.tokens)

    @staticmethod
    def _unprotected(free: list[Slot], tenant: str) -> list[Slot]:
        """The free slots but the tenant's largest cache (its conversation, as far as a slot
        table can tell)."""
        own = [slot for slot in free if slot.tenant == tenant]
        if not own:
            return free
        largest = max(own, key=lambda slot: len(slot.tokens))
        return [slot for slot in free if slot is not largest]

    def _cheapest(self, free: list[Slot], tenant: str, prompt: Sequence[int]) -> tuple[Slot, int]:
        """The free slot whose cache loses the fewest tokens to ``prompt`` (the least recently
        used of equals), and what it reuses: a second probe takes the first probe's slot, not
        the conversation's. With a cache stream per slot, one that keeps the busy slots in
        the fewest runs comes first (see the module's docstring)."""

        def reusable(slot: Slot) -> int:
            if slot.tenant != tenant:
                return 0
            return min(common_prefix_length(slot.tokens, prompt), len(prompt) - 1)

        runs = self._new_runs()
        slot = min(free, key=lambda s: (runs(s), len(s.tokens) - reusable(s), s.last_used))
        return slot, reusable(slot)

    def _least_valuable(self, free: list[Slot]) -> Slot:
        """With a cache stream per slot, the slot that leaves the fewest runs of busy slots
        (see the module's docstring); then an empty slot, in slot order; then the least
        recently used."""
        runs = self._new_runs()

        def cost(slot: Slot) -> tuple[int, bool, int]:
            empty = slot.tenant is None
            return runs(slot), not empty, 0 if empty else slot.last_used

        return min(free, key=cost)

    def _new_runs(self) -> Callable[[Slot], int]:
        """How many runs of consecutive busy slots taking a slot adds: -1 when it joins two,
        0 when it extends one, 1 when it opens one; 0 for every slot with one cache stream."""
        if not self._contiguous:
            return lambda slot: 0
        busy = {slot.seq_id for slot in self.slots if slot.busy}
        return lambda slot: 1 - len({slot.seq_id - 1, slot.seq_id + 1} & busy)

    def _keep(self, slot: Slot, tenant: str, n_reusable: int) -> int:
        """Cut the slot's cache to the reusable prefix; clear it for another tenant."""
        if self.keeper is not None:
            self.keeper.before_loss(slot, n_reusable if slot.tenant == tenant else 0)
        if slot.tenant != tenant or n_reusable == 0 or not self.prefix_reuse:
            self.clear(slot)
            return 0
        return self._trim(slot, n_reusable)

    def _trim(self, slot: Slot, n_reusable: int) -> int:
        """Keep the slot's first ``n_reusable`` tokens (0: cleared, when it cannot)."""
        if not self._memory.drop_from(slot.seq_id, n_reusable) or not self._window_intact(
            slot, n_reusable
        ):
            self.clear(slot)
            return 0
        del slot.tokens[n_reusable:]
        return n_reusable

    def _window_intact(self, slot: Slot, n_keep: int) -> bool:
        """With a trimmed sliding-window cache the positions the next token needs may be gone."""
        if self._n_swa <= 0:
            return True
        return self._memory.first_position(slot.seq_id) <= max(0, n_keep - self._n_swa)

    def rollback(self, slot: Slot, n_past: int) -> bool:
        """Forget positions >= n_past after a failed decode; False (slot cleared) if impossible."""
        if self._memory.drop_from(slot.seq_id, n_past):
            del slot.tokens[n_past:]
            return True
        self.clear(slot)
        return False

    def save_states(self) -> int:
        """Save every slot's state in the prompt cache (the engine is closing); how many."""
        if self.keeper is None:
            return 0
        return sum(self.keeper.save(slot) for slot in self.slots if slot.tokens)

    def clear(self, slot: Slot) -> None:
        self._memory.clear_sequence(slot.seq_id)
        slot.tokens.clear()

    def forget(self, matches: Callable[[str], bool]) -> int:
        """Empty the slots whose tenant ``matches`` (its caches were cleared): free ones now,
        busy ones when their request ends; none of them is saved. How many slots."""
        count = 0
        for slot in self.slots:
            if slot.tenant is None or not matches(slot.tenant):
                continue
            if slot.busy:
                slot.erase_on_release = True
            else:
                self.clear(slot)
                slot.tenant = None
            count += 1
        return count

    def release(self, slot: Slot) -> None:
        """The request is done: the slot keeps its cache (unless reuse is off, or its
        tenant's caches were cleared meanwhile) and is free."""
        if not self.prefix_reuse or slot.erase_on_release:
            self.clear(slot)
        if slot.erase_on_release:
            slot.tenant, slot.erase_on_release = None, False
        slot.busy = False
