"""One engine's side of the prompt cache: save a slot's state before it is lost, restore the
tenant's longest saved prefix into a slot when that is faster than prefilling it.

The slot table calls :meth:`SlotStates.before_loss` when it is about to clear a slot or cut
it short (another tenant, another prompt), and :meth:`SlotStates.restore` after placing a
request. Both run on the compute lane, at admission — never in the per-token path — and
neither touches the disk: the cache's writer thread does (``store``). When the engine closes
(the fleet evicts the model, the server stops, the GPU is yielded) it captures each slot on
the lane (:meth:`SlotStates.capture`) and keeps it from the closing thread
(:meth:`SlotStates.keep`), which may wait for the writer to make room (the lane, shared by
every engine, never does).

Whether a restore pays is measured: restoring costs the state's bytes over the throughput
restores have reached (per tier; a first guess until one has run), prefilling costs the
tokens over the best prefill rate the engine has shown. Without a measured prefill rate the
restore is tried (a memory copy is far cheaper than any forward pass seen so far).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from homelab.engine.prompt_cache.entry import Candidate, as_tokens
from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.store import PromptCache
from homelab.engine.slots import Slot, SlotTable
from homelab.errors import BusyError, EngineError
from homelab.llamacpp.context import Context
from homelab.llamacpp.state import (
    SequenceStateError,
    StateBytes,
    restore_sequence,
    save_sequence,
)

log = logging.getLogger("homelab.engine.prompt_cache")

FIRST_GUESS_BYTES_S = {"ram": 4e9, "disk": 1e9}  # until a restore from that tier is measured
SMOOTHING = 0.5  # weight of the newest measurement


@dataclass(frozen=True)
class Captured:
    """A slot's state, taken on the lane, to be kept in the cache from another thread."""

    tenant: str
    tokens: np.ndarray  # int32 (entry.as_tokens)
    data: bytes | bytearray
    cuttable: bool


class SlotStates:
    """Saves and restores one context's slots through the process's :class:`PromptCache`."""

    def __init__(
        self,
        context: Context,
        model: ModelKey,
        cache: PromptCache,
        prefill_tok_s: Callable[[], float],
        *,
        n_swa: int = 0,
    ) -> None:
        self._context = context
        self._n_swa = n_swa  # the model's sliding window (0: none), whatever swa_full says
        self.model = model
        self.cache = cache
        self._prefill_tok_s = prefill_tok_s
        self._best_prefill_tok_s = 0.0
        self.restore_bytes_s = dict(FIRST_GUESS_BYTES_S)

    # --- saving --------------------------------------------------------------------------------

    def before_loss(self, slot: Slot, n_keep: int) -> None:
        """``slot`` keeps only its first ``n_keep`` tokens next: save it if the rest is worth it."""
        if len(slot.tokens) - n_keep >= self.cache.config.min_tokens:
            self.save(slot)

    def save(self, slot: Slot) -> bool:
        """Put the slot's state in the cache (unless one already holds it); False if not
        kept. On the lane: it never waits for the disk."""
        if slot.tenant is None or not slot.tokens or slot.erase_on_release:
            return False
        if self._covered(slot):
            return True
        captured = self._capture(slot)
        return captured is not None and self.keep(captured)

    def capture(self, slot: Slot) -> Captured | None:
        """The slot's state to keep (on the lane), or None: nothing to keep, or kept already."""
        if slot.tenant is None or not slot.tokens or slot.erase_on_release:
            return None
        return None if self._covered(slot) else self._capture(slot)

    def keep(self, captured: Captured, *, wait: bool = False) -> bool:
        """Put a captured state in the cache; ``wait`` for room only off the lane."""
        return self.cache.put(
            self.model,
            captured.tenant,
            captured.tokens,
            captured.data,
            cuttable=captured.cuttable,
            wait=wait,
        )

    def _covered(self, slot: Slot) -> bool:
        assert slot.tenant is not None
        cuttable = self._n_swa == 0  # see _window_lost
        return self.cache.covers(self.model, slot.tenant, slot.tokens, cuttable=cuttable)

    def _capture(self, slot: Slot) -> Captured | None:
        assert slot.tenant is not None
        try:
            data = save_sequence(self._context.pointer, slot.seq_id)
        except SequenceStateError as exc:
            log.warning("prompt cache: slot %d not saved: %s", slot.seq_id, exc)
            return None
        return Captured(slot.tenant, as_tokens(slot.tokens), data, self._n_swa == 0)

    # --- restoring -----------------------------------------------------------------------------

    def restore(self, slot: Slot, prompt: Sequence[int], n_cached: int) -> int:
        """Fill ``slot`` (placed for ``prompt``, ``n_cached`` tokens already reused) from the
        tenant's best saved state when that pays: then the slot holds the state's tokens and
        the result is how many of them the prompt uses; else ``n_cached``, slot untouched."""
        tenant = slot.tenant
        if tenant is None or len(prompt) - 1 - n_cached < self.cache.config.min_tokens:
            return n_cached
        at_least = n_cached + self.cache.config.min_tokens
        candidate = self.cache.lookup(self.model, tenant, prompt, at_least)
        if candidate is None or candidate.n_usable < at_least:
            self.cache.record_miss()  # nothing saved, or too little more than the slot holds
            return n_cached
        if self._window_lost(candidate):
            self.cache.record_miss()
            return n_cached
        tier = "ram" if candidate.entry.data is not None else "disk"
        if not self._pays(candidate, candidate.n_usable - n_cached, tier):
            return n_cached
        started = time.perf_counter()
        data = self.cache.load(candidate)
        if data is None:
            return n_cached
        n_usable = self.apply(slot, candidate, data)
        if n_usable:
            self._measured(tier, len(data), time.perf_counter() - started)
        return n_usable

    def _measured(self, tier: str, n_bytes: int, elapsed_s: float) -> None:
        """A restore from ``tier`` (reading and checking included) took ``elapsed_s``."""
        if elapsed_s > 0:
            previous = self.restore_bytes_s[tier]
            self.restore_bytes_s[tier] = (
                SMOOTHING * n_bytes / elapsed_s + (1 - SMOOTHING) * previous
            )

    def _window_lost(self, candidate: Candidate) -> bool:
        """llama.cpp saves a sliding-window layer's cells only inside the window of the
        state's last position, even with full-size window caches: cut back by more than one
        token, the restored state would miss positions the next token attends to."""
        return self._n_swa > 0 and candidate.n_usable < len(candidate.entry.tokens) - 1

    def _pays(self, candidate: Candidate, n_gained: int, tier: str) -> bool:
        observed = self._prefill_tok_s()
        self._best_prefill_tok_s = max(self._best_prefill_tok_s, observed)
        if self._best_prefill_tok_s <= 0:
            return True
        restore_s = candidate.entry.n_bytes / self.restore_bytes_s[tier]
        return restore_s < n_gained / self._best_prefill_tok_s

    def apply(self, slot: Slot, candidate: Candidate, data: StateBytes) -> int:
        """Put ``data`` (``candidate``'s state) into ``slot``; the prompt tokens it serves
        (0: llama.cpp refused it — the state is dropped, the slot left empty)."""
        try:
            restore_sequence(self._context.pointer, slot.seq_id, data)
        except SequenceStateError as exc:
            log.warning("prompt cache: %s", exc)
            self.cache.discard(candidate.entry)
            self._context.memory.clear_sequence(slot.seq_id)  # whatever half got in
            slot.tokens.clear()
            return 0
        slot.tokens[:] = candidate.entry.tokens.tolist()
        return candidate.n_usable


# --- the admin API: one slot by hand (llama-server's /slots/{id}?action=...) ---------------

SLOT_ACTIONS = ("save", "restore", "erase")


def slot_action(
    table: SlotTable, states: SlotStates | None, seq_id: int, action: str, tenant: str | None
) -> dict[str, object]:
    """``save`` a free slot's state in the cache (and to disk: ``on_disk`` is then a future
    the caller waits for, off the lane), ``restore`` ``tenant``'s most recently used state
    into it, or ``erase`` it. Runs on the compute lane."""
    slot = _free_slot(table, seq_id)
    if action == "erase":
        table.clear(slot)
        slot.tenant = None
        return {"id_slot": seq_id, "action": action, "n_tokens": 0}
    if states is None:
        raise EngineError(
            "this engine keeps no prompt cache",
            hint="Start serve without --no-prompt-cache (recurrent models have none).",
        )
    if action == "save":
        return _save_action(states, slot)
    if action == "restore":
        return _restore_action(states, slot, tenant)
    raise EngineError(f"unknown slot action {action!r}", hint=f"Use one of {SLOT_ACTIONS}.")


def _free_slot(table: SlotTable, seq_id: int) -> Slot:
    if not 0 <= seq_id < len(table.slots):
        raise EngineError(
            f"there is no slot {seq_id}: this engine has {len(table.slots)}",
            hint="List the slots with GET /admin/slots.",
        )
    slot = table.slots[seq_id]
    if slot.busy:
        raise BusyError(f"slot {seq_id} is serving a request", hint="Retry when it is free.")
    return slot


def _save_action(states: SlotStates, slot: Slot) -> dict[str, object]:
    if not states.save(slot):
        raise EngineError(
            f"slot {slot.seq_id} holds nothing to save", hint="Send it a request first."
        )
    assert slot.tenant is not None  # save() saved it
    on_disk: Future[bool] = states.cache.persist(states.model, slot.tenant, slot.tokens)
    return {
        "id_slot": slot.seq_id,
        "action": "save",
        "n_tokens": len(slot.tokens),
        "on_disk": on_disk,
    }


def _restore_action(states: SlotStates, slot: Slot, tenant: str | None) -> dict[str, object]:
    if not tenant:
        raise EngineError("say whose state to restore", hint='Send {"tenant": NAME} in the body.')
    candidate = states.cache.latest(states.model, tenant)
    data = states.cache.load(candidate) if candidate is not None else None
    if candidate is None or data is None:
        raise EngineError(
            f"the prompt cache holds no state of {tenant!r} for this model",
            hint="Save one first (action=save), or send that tenant's request.",
        )
    slot.tenant = tenant
    n_tokens = states.apply(slot, candidate, data)
    if n_tokens == 0:
        slot.tenant = None
        raise EngineError("llama.cpp refused the saved state", hint="The state was dropped.")
    return {"id_slot": slot.seq_id, "action": "restore", "n_tokens": n_tokens, "tenant": tenant}
