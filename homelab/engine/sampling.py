"""Per-request sampling through llama.cpp's C sampler chains.

Each request owns one chain built from its :class:`~homelab.engine.api.SamplingParams`, in
llama.cpp's usual order::

    logit bias → penalties → grammar → top-k → top-p → min-p → temperature → dist(seed)

(greedy when temperature <= 0: bias → penalties → grammar → greedy). Sampling is one C call,
``llama_sampler_sample(chain, ctx, batch_index)``, which reads that sequence's logits row and
accepts the token into every stateful sampler (penalties, grammar). Log-probabilities are the
model's own (before bias, penalties and temperature), computed from the logits row only when
a request asks for them.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from homelab.engine.api import SamplingParams
from homelab.errors import EngineError
from homelab.llamacpp import capture_log, joined, llama

RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed


class SamplerChain:
    """A llama.cpp sampler chain for one request (free it with :meth:`close`)."""

    def __init__(
        self,
        params: SamplingParams,
        vocab: Any,
        n_vocab: int,
        eog_tokens: Collection[int],
    ) -> None:
        self._lib = llama()
        self.params = params
        self.penalties: Any = None
        lib = self._lib
        self.chain: Any = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        try:
            self._build(params, vocab, n_vocab, eog_tokens)
        except BaseException:
            self.close()
            raise

    def _add(self, sampler: Any) -> None:
        self._lib.llama_sampler_chain_add(self.chain, sampler)

    def _build(
        self, p: SamplingParams, vocab: Any, n_vocab: int, eog_tokens: Collection[int]
    ) -> None:
        lib = self._lib
        biases = _biases(p, n_vocab, eog_tokens)
        if biases:
            array = (lib.llama_logit_bias * len(biases))()
            for entry, (token, bias) in zip(array, biases.items(), strict=True):
                entry.token, entry.bias = token, bias
            self._add(lib.llama_sampler_init_logit_bias(n_vocab, len(biases), array))
        if _has_penalties(p):
            self.penalties = lib.llama_sampler_init_penalties(
                n_vocab, p.penalty_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
            self._add(self.penalties)
        if p.grammar:
            self._add(_grammar_sampler(vocab, p.grammar))
        if p.temperature <= 0:
            self._add(lib.llama_sampler_init_greedy())
            return
        if p.top_k > 0:
            self._add(lib.llama_sampler_init_top_k(p.top_k))
        if 0 < p.top_p < 1:
            self._add(lib.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0:
            self._add(lib.llama_sampler_init_min_p(p.min_p, 1))
        self._add(lib.llama_sampler_init_temp(p.temperature))
        seed = RANDOM_SEED if p.seed is None else p.seed & 0xFFFFFFFF
        self._add(lib.llama_sampler_init_dist(seed))

    def accept_prompt(self, tokens: Sequence[int]) -> None:
        """Let the penalties see the end of the prompt, as llama.cpp's own tools do."""
        if self.penalties is None:
            return
        accept = self._lib.llama_sampler_accept
        for token in (
            tokens[-self.params.penalty_last_n :] if self.params.penalty_last_n > 0 else ()
        ):
            accept(self.penalties, token)

    def sample(self, ctx: Any, batch_index: int) -> int:
        return int(self._lib.llama_sampler_sample(self.chain, ctx, batch_index))

    def close(self) -> None:
        if self.chain is not None:
            self._lib.llama_sampler_free(self.chain)  # frees every sampler in the chain
            self.chain = None


def _has_penalties(p: SamplingParams) -> bool:
    return p.penalty_last_n != 0 and (
        p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
    )


def _biases(p: SamplingParams, n_vocab: int, eog_tokens: Collection[int]) -> dict[int, float]:
    biases: dict[int, float] = {}
    for token, bias in p.logit_bias.items():
        token = int(token)
        if not 0 <= token < n_vocab:
            raise EngineError(
                f"logit_bias names token {token}, outside this model's vocabulary "
                f"(0..{n_vocab - 1})"
            )
        biases[token] = max(-100.0, min(100.0, float(bias))) if math.isfinite(bias) else bias
    if p.ignore_eos and not p.grammar:  # a finished grammar allows only end-of-generation
        for token in eog_tokens:
            biases[token] = -math.inf
    return biases


def _grammar_sampler(vocab: Any, grammar: str) -> Any:
    from homelab.engine.grammar import check_grammar

    check_grammar(grammar)
    with capture_log() as lines:
        sampler = llama().llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        detail = joined(lines).strip().splitlines()
        raise EngineError(
            "the grammar could not be parsed" + (f": {detail[-1]}" if detail else ""),
            hint="Check the GBNF syntax; the start rule must be called 'root'.",
        )
    return sampler


# --- log-probabilities -------------------------------------------------------------------


def logits_row(ctx: Any, batch_index: int, n_vocab: int) -> np.ndarray:
    """The logits of one batch row, as a numpy view (valid until the next decode)."""
    pointer = llama().llama_get_logits_ith(ctx, batch_index)
    return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (n_vocab,))


def top_logprobs(
    logits: np.ndarray, chosen: int, n_top: int
) -> tuple[float, list[tuple[int, float]]]:
    """log-softmax of the chosen token and the ``n_top`` most likely tokens (best first)."""
    peak = float(logits.max())
    log_total = peak + math.log(float(np.exp(logits - peak, dtype=np.float64).sum()))
    chosen_logprob = float(logits[chosen]) - log_total
    if n_top <= 0:
        return chosen_logprob, []
    n_top = min(n_top, logits.shape[0])
    best = np.argpartition(logits, -n_top)[-n_top:]
    best = best[np.argsort(-logits[best], kind="stable")]
    return chosen_logprob, [(int(t), float(logits[t]) - log_total) for t in best]
