"""A model's vocabulary: text to tokens and back, and its special tokens.

``llama_tokenize`` writes into a buffer the caller sizes; when the buffer is too small it
writes nothing and returns the needed size as a negative count. One token per byte is legal
(a vocabulary that falls back to byte tokens; SentencePiece's ``▁`` alone is three bytes), so
no guess from the text's length is safe: :meth:`Vocab.tokenize` asks again with the size
llama.cpp gave. ``llama_token_to_piece`` works the same way.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from homelab.errors import EngineClosedError, EngineError
from homelab.llamacpp._lib import lib

PIECE_BUFFER_BYTES = 256  # longer than any token llama.cpp renders in practice


class Vocab:
    """The vocabulary of a loaded model (valid while the model is)."""

    def __init__(self, pointer: Any) -> None:
        self._lib = lib()
        self.pointer = pointer
        self.n_tokens = int(self._lib.llama_vocab_n_tokens(pointer))

    # --- special tokens --------------------------------------------------------------------

    @property
    def bos(self) -> int:
        return int(self._lib.llama_vocab_bos(self.pointer))

    @property
    def eos(self) -> int:
        return int(self._lib.llama_vocab_eos(self.pointer))

    @property
    def adds_bos(self) -> bool:
        """Whether the model expects a BOS token in front of a text."""
        return bool(self._lib.llama_vocab_get_add_bos(self.pointer))

    @property
    def adds_eos(self) -> bool:
        return bool(self._lib.llama_vocab_get_add_eos(self.pointer))

    @property
    def kind(self) -> int:
        """llama.cpp's ``enum llama_vocab_type`` (SPM, BPE, WPM, UGM, RWKV...)."""
        return int(self._lib.llama_vocab_type(self.pointer))

    def is_end_of_generation(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self.pointer, token))

    def end_of_generation_tokens(self) -> frozenset[int]:
        """Every token that ends a generation (EOS, EOT, ``<|im_end|>``…)."""
        return frozenset(t for t in range(self.n_tokens) if self.is_end_of_generation(t))

    # --- text <-> tokens -------------------------------------------------------------------

    def _live_pointer(self) -> Any:
        """The vocabulary's pointer, or EngineClosedError once its model is freed (a NULL
        vocabulary crashes llama.cpp: a request tokenized after its engine closed)."""
        pointer = self.pointer
        if pointer is None:
            raise EngineClosedError(
                "the model was unloaded: its vocabulary is gone",
                hint="Send the request again; the server loads the model anew.",
            )
        return pointer

    def tokenize(self, text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
        """The tokens of ``text``; ``parse_special`` reads ``<|im_start|>`` as one token."""
        data = text.encode("utf-8")
        count, tokens = self._tokenize_into(data, len(data) + 2, add_bos, parse_special)
        if count < 0:  # too small: llama.cpp says how many it needs
            count, tokens = self._tokenize_into(data, -count, add_bos, parse_special)
        if count < 0:
            raise EngineError(
                f"llama.cpp could not tokenize a text of {len(data)} bytes",
                hint="Check that the text is valid UTF-8 and the model's vocabulary loads.",
            )
        return list(tokens[:count])

    def _tokenize_into(
        self, data: bytes, capacity: int, add_bos: bool, parse_special: bool
    ) -> tuple[int, Any]:
        tokens = (self._lib.llama_token * capacity)()
        count = self._lib.llama_tokenize(
            self._live_pointer(), data, len(data), tokens, capacity, add_bos, parse_special
        )
        return int(count), tokens

    def token_bytes(self, token: int, *, special: bool) -> bytes:
        """The bytes llama.cpp renders for one token (control tokens only when ``special``).

        Safe from any thread: each call has its own buffer (callers cache hot tokens).
        """
        buffer = ctypes.create_string_buffer(PIECE_BUFFER_BYTES)
        pointer = self._live_pointer()
        size = self._lib.llama_token_to_piece(pointer, token, buffer, len(buffer), 0, special)
        if size < 0:  # longer than the buffer: llama.cpp says how long
            buffer = ctypes.create_string_buffer(-size)
            size = self._lib.llama_token_to_piece(pointer, token, buffer, len(buffer), 0, special)
        return bytes(buffer.raw[: max(size, 0)])

    def longest_token_bytes(self) -> int | None:
        """The most bytes of text one token stands for (a text of B bytes has at least
        B / this many tokens), or None for a vocabulary that normalises text before
        tokenizing it (WordPiece, Unigram...), where a token may stand for more than it spells.
        One call per token of the vocabulary: cache the answer."""
        as_written = (
            self._lib.LLAMA_VOCAB_TYPE_SPM,
            self._lib.LLAMA_VOCAB_TYPE_BPE,
            self._lib.LLAMA_VOCAB_TYPE_RWKV,
        )
        if int(self._lib.llama_vocab_type(self.pointer)) not in as_written:
            return None
        return max(len(self.token_bytes(t, special=True)) for t in range(self.n_tokens))

    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> str:
        """The text of ``tokens`` (invalid UTF-8 replaced)."""
        data = b"".join(self.token_bytes(int(token), special=special) for token in tokens)
        return data.decode("utf-8", errors="replace")
