"""Refusing a text that cannot fit a context after work bounded by the context, not the text.

llama.cpp first splits a text at its special tokens (``<|im_start|>``…), and for each special
token of the vocabulary it searches the rest of the text again from every fragment found so
far: the time grows with the square of the number of special tokens in the text. A chat of
20,000 short messages (145K tokens) takes 4 s to tokenize, four times as many take 16 times as
long. Any client could buy that with a prompt that is refused anyway. So, before the text is
tokenized whole:

1. **A bound from its size.** When a vocabulary tokenizes text as written (SentencePiece,
   byte-level BPE, RWKV: no normalisation), no token stands for more bytes of text than the
   longest token spells, so a text of ``B`` bytes has at least ``B / longest`` tokens. No
   tokenization at all.
2. **Counting in pieces.** A long text is tokenized in pieces of a few thousand characters cut
   at whitespace, stopping as soon as the pieces hold more tokens than the limit allows, with
   an allowance at every cut (a piece may start with a token or two that the whole text would
   have merged across the cut). Work proportional to the limit, whatever the text's size.

Only a text that passes both is tokenized whole (and counted exactly). The result is always
the tokenization of the whole text: pieces are only ever used to refuse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from homelab.errors import ContextLengthError

PIECE_CHARS = 4096  # small enough that a piece full of special tokens tokenizes in ~1 ms
CUT_ALLOWANCE_TOKENS = 8  # tokens one cut may add; generous (one or two are seen)
PIECEWISE_FROM_CHARS = 4 * PIECE_CHARS  # shorter texts tokenize whole in a few ms anyway
HINT = "Shorten the prompt, or plan a longer context per slot."

Tokenize = Callable[[str, bool], Sequence[int]]  # (text, add_bos) -> token ids


def tokenize_within(
    tokenize: Tokenize,
    text: str,
    limit: int,
    *,
    add_bos: bool = True,
    longest_token_bytes: Callable[[], int | None] = lambda: None,
) -> list[int]:
    """The tokens of ``text``, or :class:`ContextLengthError` when there are more than ``limit``.

    ``longest_token_bytes()`` is the most bytes of text one token can stand for, or None when
    the vocabulary may normalise text (then only the piecewise count applies); it is called
    only for a text longer than ``limit`` bytes.
    """
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > limit:  # a shorter text has at most ~limit tokens: no early refusal possible
        _refuse_by_size(size, limit, longest_token_bytes())
        if len(text) >= PIECEWISE_FROM_CHARS:
            _refuse_by_pieces(tokenize, text, limit, add_bos)
    tokens = list(tokenize(text, add_bos))
    if len(tokens) > limit:
        raise ContextLengthError(
            f"the prompt has {len(tokens)} tokens, more than the {limit} that fit", hint=HINT
        )
    return tokens


def _refuse_by_size(size: int, limit: int, longest: int | None) -> None:
    if longest is None or longest < 1:
        return
    at_least = -(-size // longest)
    if at_least > limit:
        raise ContextLengthError(
            f"the prompt's {size} bytes are at least {at_least} tokens, "
            f"more than the {limit} that fit",
            hint=HINT,
        )


def _refuse_by_pieces(tokenize: Tokenize, text: str, limit: int, add_bos: bool) -> None:
    counted = 0
    for cuts, (end, piece) in enumerate(pieces(text)):
        counted += len(tokenize(piece, add_bos and cuts == 0))
        at_least = counted - CUT_ALLOWANCE_TOKENS * cuts
        if at_least > limit:
            raise ContextLengthError(
                f"the prompt's first {end} characters are already at least {at_least} tokens, "
                f"more than the {limit} that fit",
                hint=HINT,
            )


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[tuple[int, str]]:
    """``(end, piece)``: ``text`` in pieces of at most ``size`` characters that join back to
    it, each cut just before a space or newline where there is one in its second half (so
    words, and the special tokens between them, stay whole)."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = max(
                text.rfind(" ", start + size // 2, end), text.rfind("\n", start + size // 2, end)
            )
            end = cut if cut > start else end
        yield end, text[start:end]
        start = end
