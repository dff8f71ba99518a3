"""llama.cpp's sampler chains: samplers applied in the order they are added, then one pick.

:meth:`SamplerChain.sample` is one C call, ``llama_sampler_sample(chain, ctx, row)``: it reads
that batch row's logits, runs every sampler and accepts the chosen token into the stateful
ones (penalties, grammar). Which samplers, in which order, is the engine's policy
(``homelab.engine.sampling``); this class only speaks the C API.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from homelab.errors import EngineError
from homelab.llamacpp._lib import lib
from homelab.llamacpp.context import Context
from homelab.llamacpp.log import capture_log, joined
from homelab.llamacpp.vocab import Vocab

RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed
MIN_KEEP = 1  # top-p and min-p keep at least this many candidates
# struct llama_token_data { llama_token id; float logit; float p; }
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class SamplerChain:
    """One chain (one request's); free it, and every sampler in it, with :meth:`close`."""

    def __init__(self) -> None:
        self._lib = lib()
        self.pointer: Any = self._lib.llama_sampler_chain_init(
            self._lib.llama_sampler_chain_default_params()
        )
        self._penalties: Any = None
        self._candidates = np.empty(0, dtype=TOKEN_DATA)  # reused by pick(), with:
        self._candidates_address = 0
        self._candidates_pointer: Any = None
        self._array: Any = self._lib.llama_token_data_array()
        self._array_ref: Any = ctypes.byref(self._array)

    def _add(self, sampler: Any) -> None:
        self._lib.llama_sampler_chain_add(self.pointer, sampler)  # the chain now owns it

    def add_logit_bias(self, n_vocab: int, biases: Mapping[int, float]) -> None:
        """Add ``bias`` to the logit of each token (``-inf`` bans it)."""
        array = (self._lib.llama_logit_bias * len(biases))()
        for entry, (token, bias) in zip(array, biases.items(), strict=True):
            entry.token, entry.bias = token, bias
        self._add(self._lib.llama_sampler_init_logit_bias(n_vocab, len(biases), array))

    def add_penalties(
        self, n_vocab: int, last_n: int, repeat: float, frequency: float, presence: float
    ) -> None:
        """Repetition penalties over the last ``last_n`` tokens (see :meth:`remember`)."""
        self._penalties = self._lib.llama_sampler_init_penalties(
            n_vocab, last_n, repeat, frequency, presence
        )
        self._add(self._penalties)

    def remember(self, tokens: Sequence[int]) -> None:
        """Let the penalties see ``tokens`` (a prompt) as if they had been sampled."""
        if self._penalties is None:
            return
        accept = self._lib.llama_sampler_accept
        for token in tokens:
            accept(self._penalties, token)

    def add_grammar(self, vocab: Vocab, grammar: str, root: str = "root") -> None:
        """Allow only text the GBNF ``grammar`` accepts; EngineError when it does not parse."""
        with capture_log() as lines:
            sampler = self._lib.llama_sampler_init_grammar(
                vocab.pointer, grammar.encode(), root.encode()
            )
        if not sampler:
            detail = joined(lines).strip().splitlines()
            raise EngineError(
                "the grammar could not be parsed" + (f": {detail[-1]}" if detail else ""),
                hint=f"Check the GBNF syntax; the start rule must be called '{root}'.",
            )
        self._add(sampler)

    def add_greedy(self) -> None:
        self._add(self._lib.llama_sampler_init_greedy())

    def add_top_k(self, k: int) -> None:
        self._add(self._lib.llama_sampler_init_top_k(k))

    def add_top_p(self, p: float) -> None:
        self._add(self._lib.llama_sampler_init_top_p(p, MIN_KEEP))

    def add_min_p(self, p: float) -> None:
        self._add(self._lib.llama_sampler_init_min_p(p, MIN_KEEP))

    def add_temperature(self, temperature: float) -> None:
        self._add(self._lib.llama_sampler_init_temp(temperature))

    def add_random_pick(self, seed: int | None) -> None:
        """Pick from the remaining distribution; ``None`` lets llama.cpp choose the seed."""
        self._add(self._lib.llama_sampler_init_dist(RANDOM_SEED if seed is None else seed))

    def sample(self, context: Context, row: int) -> int:
        """The token chosen from batch row ``row`` of the last decode on ``context``."""
        return int(self._lib.llama_sampler_sample(self.pointer, context.pointer, row))

    def pick(self, ids: np.ndarray, logits: np.ndarray) -> int:
        """The token the chain chooses among the candidates ``ids`` with these ``logits``
        (the others are out of the running), accepted as :meth:`sample` accepts it."""
        n = len(ids)
        if len(self._candidates) < n:
            self._grow(n)
        data = self._candidates
        data["id"][:n], data["logit"][:n], data["p"][:n] = ids, logits, 0.0
        array = self._array
        array.data, array.size, array.selected, array.sorted = self._candidates_pointer, n, -1, 0
        self._lib.llama_sampler_apply(self.pointer, self._array_ref)
        selected = array.selected
        if not 0 <= selected < array.size:
            raise EngineError("the sampler chain picked no token", hint="Check the logit_bias.")
        moved = ctypes.cast(array.data, ctypes.c_void_p).value != self._candidates_address
        token = int(array.data[selected].id if moved else data["id"][selected])
        self._lib.llama_sampler_accept(self.pointer, token)
        return token

    def _grow(self, n: int) -> None:
        self._candidates = np.zeros(max(n, 2 * len(self._candidates), 512), dtype=TOKEN_DATA)
        self._candidates_address = self._candidates.ctypes.data
        self._candidates_pointer = ctypes.cast(
            self._candidates_address, ctypes.POINTER(self._lib.llama_token_data)
        )

    def accept(self, token: int) -> None:
        """Record ``token`` as chosen (penalties, grammar) when it was picked outside the
        chain, e.g. by speculative decoding's acceptance rule."""
        self._lib.llama_sampler_accept(self.pointer, token)

    def close(self) -> None:
        if self.pointer is not None:
            self._lib.llama_sampler_free(self.pointer)
            self.pointer = None
