"""A ``llama_batch``: the tokens of one ``llama_decode``, each with its position and sequence.

One batch may mix sequences (the engine decodes every slot in one call). Each token belongs
to one sequence here (``n_seq_id = 1``), and only tokens marked as outputs get logits — the
engine asks for the last token of each sequence, the quality evaluator for every token.
Rows are numbered in the order tokens are added; sampling and logits refer to those rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from homelab.errors import EngineError
from homelab.llamacpp._lib import lib


class Batch:
    """Room for ``capacity`` tokens; fill it, decode it, :meth:`clear` it, fill it again."""

    def __init__(self, capacity: int) -> None:
        self._lib = lib()
        self.capacity = capacity
        self.c_batch: Any = self._lib.llama_batch_init(capacity, 0, 1)
        self.n_tokens = 0
        self._token = self.c_batch.token
        self._pos = self.c_batch.pos
        self._output = self.c_batch.logits
        self._seq_rows = [self.c_batch.seq_id[i] for i in range(capacity)]
        for row in range(capacity):
            self.c_batch.n_seq_id[row] = 1

    def clear(self) -> None:
        self.n_tokens = self.c_batch.n_tokens = 0

    def add(self, token: int, position: int, seq_id: int, *, output: bool = False) -> int:
        """Append one token; returns its row."""
        return self.add_run((token,), position, seq_id, output_last=output)

    def add_one(self, token: int, position: int, seq_id: int) -> int:
        """Append one token whose logits are wanted (a generating sequence's, every step);
        returns its row."""
        row = self.n_tokens
        if row >= self.capacity:
            raise EngineError(
                f"a batch of {self.capacity} tokens cannot take {row + 1}",
                hint="Split the tokens over several decodes (a homelab bug if you see this).",
            )
        self._token[row] = token
        self._pos[row] = position
        self._seq_rows[row][0] = seq_id
        self._output[row] = 1
        self.n_tokens = self.c_batch.n_tokens = row + 1
        return row

    def advance(self, row: int, token: int, position: int) -> None:
        """Give ``row`` (a generating sequence's, added by :meth:`add_one`) its next token and
        position, keeping its sequence and output flag: the same sequences step again."""
        self._token[row] = token
        self._pos[row] = position

    def add_run(
        self,
        tokens: Sequence[int],
        first_position: int,
        seq_id: int,
        *,
        output_last: bool = False,
        output_all: bool = False,
    ) -> int:
        """Append consecutive tokens of one sequence; returns the row of the last one."""
        row = self.n_tokens
        if row + len(tokens) > self.capacity:
            raise EngineError(
                f"a batch of {self.capacity} tokens cannot take {row + len(tokens)}",
                hint="Split the tokens over several decodes (a homelab bug if you see this).",
            )
        token, pos, output, seq_rows = self._token, self._pos, self._output, self._seq_rows
        flag = 1 if output_all else 0
        position = first_position
        for value in tokens:
            token[row] = value
            pos[row] = position
            seq_rows[row][0] = seq_id
            output[row] = flag
            row += 1
            position += 1
        if output_last and tokens:
            output[row - 1] = 1
        self.n_tokens = self.c_batch.n_tokens = row
        return row - 1

    def close(self) -> None:
        if self.c_batch is not None:
            self._lib.llama_batch_free(self.c_batch)
            self.c_batch = None
