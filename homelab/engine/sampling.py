"""Per-request sampling through llama.cpp's C sampler chains.

Each request owns one chain built from its :class:`~homelab.engine.api.SamplingParams`, in
llama.cpp's usual order::

    logit bias → penalties → grammar → top-k → top-p → min-p → temperature → dist(seed)

(greedy when temperature <= 0: bias → penalties → grammar → greedy). Sampling is one C call,
``llama_sampler_sample(chain, ctx, batch_index)``, which reads that sequence's logits row and
accepts the token into every stateful sampler (penalties, grammar). Log-probabilities are the
model's own (before bias, penalties and temperature), computed from the logits row only when
a request asks for them.

That C call copies the whole vocabulary into a candidate array and sorts its way to the top
k, per sequence per step, on the CPU: 130 µs at 32K tokens, 300-500 µs at 152K — at 16
sequences more than a GPU's decode step. A chain whose first cut is top-k (no penalties, no
grammar, no positive bias) over a vocabulary of at least ``TOP_K_FIRST_MIN_VOCAB`` tokens
(Llama 3, Qwen, Gemma) is handed only the tokens that can survive the cut
(:func:`top_candidates`: a few hundred) and runs on those: the same top k, in the same
order, so the same pick from the same random stream (~4x faster at 152K tokens;
``benchmarks/sampling_bench.py --sampled``). Below that size the numpy and ctypes calls cost
what they save.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

import numpy as np

from homelab.engine.api import SamplingParams
from homelab.errors import EngineError
from homelab.llamacpp import sampler
from homelab.llamacpp.context import Context
from homelab.llamacpp.vocab import Vocab

# below, the C chain over the whole vocabulary is as fast after a real decode (16 sequences,
# µs between decodes: 1K tokens 354 whole vs 671 top-k first; 32K 1,298 vs 1,321)
TOP_K_FIRST_MIN_VOCAB = 65536
TOP_K_FIRST_MAX_K = 1024  # a larger top-k cuts little: the whole vocabulary it is
SAMPLE_STRIDE = 37  # top_candidates reads every 37th logit to place its threshold
SPARE_SAMPLES = 8  # ...that many more sampled logits above it than top-k needs


class SamplerChain:
    """The llama.cpp sampler chain of one request (free it with :meth:`close`)."""

    def __init__(
        self,
        params: SamplingParams,
        vocab: Vocab,
        n_vocab: int,
        eog_tokens: Collection[int],
    ) -> None:
        self.params = params
        # the most likely token and nothing else (ending the text may be banned): the
        # scheduler may then pick it for a whole batch with one argmax
        self.plain_greedy = _plain_greedy(params)
        self._chain = sampler.SamplerChain()
        # the token chosen from batch row ``row`` of the last decode on ``context``
        # (``sample(context, row)``): the C chain's own method, no wrapper per token
        self.sample: Callable[[Context, int], int] = self._chain.sample
        try:
            biases = self._build(params, vocab, n_vocab, eog_tokens)
        except BaseException:
            self.close()
            raise
        if _top_k_first(params, biases, n_vocab):
            # the top k of the biased logits are among the top k + (banned or lowered) raw ones
            self._n_candidates = params.top_k + len(biases)
            self.sample = self._sample_top_k_first

    def _build(
        self, p: SamplingParams, vocab: Vocab, n_vocab: int, eog_tokens: Collection[int]
    ) -> dict[int, float]:
        """Add the samplers; the logit biases, as the chain applies them."""
        chain = self._chain
        biases = _biases(p, n_vocab, eog_tokens)
        if biases:
            chain.add_logit_bias(n_vocab, biases)
        if _has_penalties(p):
            chain.add_penalties(
                n_vocab, p.penalty_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
        if p.grammar:
            from homelab.engine.grammar import check_grammar

            check_grammar(p.grammar)
            chain.add_grammar(vocab, p.grammar)
        if p.temperature <= 0:
            chain.add_greedy()
            return biases
        if p.top_k > 0:
            chain.add_top_k(p.top_k)
        if 0 < p.top_p < 1:
            chain.add_top_p(p.top_p)
        if p.min_p > 0:
            chain.add_min_p(p.min_p)
        chain.add_temperature(p.temperature)
        chain.add_random_pick(None if p.seed is None else p.seed & 0xFFFFFFFF)
        return biases

    def _sample_top_k_first(self, context: Context, row: int) -> int:
        """``sample``, for a chain that cuts to its top k first: the chain runs on the few
        hundred tokens that can survive the cut (the C call over the whole row when the
        threshold misjudged the row)."""
        logits = context.logits_row(row)
        ids = top_candidates(logits, self._n_candidates)
        if ids is None:
            return self._chain.sample(context, row)
        return self._chain.pick(ids, logits[ids])

    def accept_prompt(self, tokens: Sequence[int]) -> None:
        """Let the penalties see the end of the prompt, as llama.cpp's own tools do."""
        last_n = self.params.penalty_last_n
        if last_n > 0:
            self._chain.remember(tokens[-last_n:])

    def distribution(self, context: Context, batch_index: int) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) the random pick would draw from at ``batch_index``
        (speculative sampling's ``p``); changes no sampler state."""
        from homelab.llamacpp.candidates import shaped_distribution

        return shaped_distribution(self._chain, context, batch_index)

    def accept(self, token: int) -> None:
        """``token`` was chosen outside :meth:`sample` (speculative sampling): let the
        penalties and the grammar see it."""
        self._chain.accept(token)

    def close(self) -> None:
        self._chain.close()  # frees every sampler in the chain


def top_candidates(logits: np.ndarray, n_keep: int) -> np.ndarray | None:
    """The ids of the tokens whose logit reaches a threshold that at least ``n_keep`` of
    them reach — a superset of the ``n_keep`` largest, in id order; None when fewer reach
    it. The threshold is read from every ``SAMPLE_STRIDE``-th logit (twice as many of those
    above it as ``n_keep`` needs, and a few more), then one comparison over the row: ~300
    ids of 152K for a top-40."""
    sample = logits[::SAMPLE_STRIDE]
    rank = min(len(sample) - 1, 2 * n_keep // SAMPLE_STRIDE + SPARE_SAMPLES)
    position = len(sample) - 1 - rank
    threshold = np.partition(sample, position)[position]
    ids = np.flatnonzero(logits >= threshold)
    return ids if len(ids) >= n_keep else None


def _top_k_first(p: SamplingParams, biases: dict[int, float], n_vocab: int) -> bool:
    """Whether the chain's first cut is its top k: nothing before it can lift a token into
    the top k (no penalties, no grammar, no positive bias) and the vocabulary is large."""
    return (
        p.temperature > 0
        and 0 < p.top_k <= TOP_K_FIRST_MAX_K
        and not p.grammar
        and not _has_penalties(p)
        and all(bias <= 0 for bias in biases.values())
        and n_vocab >= TOP_K_FIRST_MIN_VOCAB
    )


def _plain_greedy(p: SamplingParams) -> bool:
    return (
        p.temperature <= 0
        and not p.grammar
        and not p.logit_bias
        and not _has_penalties(p)
        and p.logprobs is None
    )


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


# --- log-probabilities -------------------------------------------------------------------


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
