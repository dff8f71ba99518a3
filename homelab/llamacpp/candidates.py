"""The distribution a sampler chain picks from, for speculative decoding's acceptance rule.

``llama_sampler_sample`` shapes a logits row (bias, penalties, grammar, top-k/p, min-p,
temperature) and picks one token in a single C call. The acceptance rule of speculative
sampling needs the shaped distribution itself, so :func:`shaped_distribution` runs every
sampler of a chain but the last (the random pick) on a ``llama_token_data_array`` built
over the row, and returns the surviving candidates with their softmax probabilities. It
changes no sampler state; the caller accepts the token it settles on with
:meth:`~homelab.llamacpp.sampler.SamplerChain.accept`.
"""

from __future__ import annotations

import ctypes

import numpy as np

from homelab.errors import EngineError
from homelab.llamacpp._lib import lib
from homelab.llamacpp.context import Context
from homelab.llamacpp.sampler import TOKEN_DATA, SamplerChain


def shaped_distribution(
    chain: SamplerChain, context: Context, row: int
) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities) the chain's final pick would draw from at batch ``row``."""
    module = lib()
    n_vocab = context.n_vocab
    data = np.empty(n_vocab, dtype=TOKEN_DATA)
    data["id"] = np.arange(n_vocab, dtype=np.int32)
    data["logit"] = context.logits_row(row)
    data["p"] = 0.0
    array = module.llama_token_data_array(
        data.ctypes.data_as(ctypes.POINTER(module.llama_token_data)), n_vocab, -1, False
    )
    n_samplers = int(module.llama_sampler_chain_n(chain.pointer))
    for index in range(n_samplers - 1):  # everything but the final random pick
        sampler = module.llama_sampler_chain_get(chain.pointer, index)
        module.llama_sampler_apply(sampler, ctypes.byref(array))
    return _softmax(_read(array, data))


def _read(array: ctypes.Structure, data: np.ndarray) -> np.ndarray:
    """The candidates the samplers left (they shrink ``size``; some move ``data``)."""
    size = int(array.size)
    address = ctypes.cast(array.data, ctypes.c_void_p).value
    if address == data.ctypes.data:
        return data[:size].copy()
    buffer = (ctypes.c_char * (size * TOKEN_DATA.itemsize)).from_address(address or 0)
    return np.frombuffer(memoryview(buffer), dtype=TOKEN_DATA).copy()


def _softmax(candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = candidates["logit"].astype(np.float64)
    finite = np.isfinite(logits)
    if not finite.any():
        raise EngineError(
            "the sampler chain left no token to pick from",
            hint="Check the grammar and logit_bias of the request.",
        )
    ids, logits = candidates["id"][finite], logits[finite]
    weights = np.exp(logits - logits.max())
    return ids.astype(np.int64), weights / weights.sum()
