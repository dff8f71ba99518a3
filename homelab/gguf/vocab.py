"""A small SentencePiece-style vocabulary that round-trips any text.

256 byte tokens make every string encodable (llama.cpp falls back to them for unknown
characters); word pieces with all their prefixes make ordinary English text compact,
because SPM only merges towards pieces whose every intermediate merge is in the vocabulary.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass

SPACE = "\u2581"  # "▁", SentencePiece's word boundary

# token types as llama.cpp's GGUF vocab expects them
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6

SPECIALS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = range(5)

_WORD_TEXT = """
the of and to in is it you that he was for on are with as his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new
work part take get place made live where after back little only round man year came show
every good me give our under name very through just form sentence great think say help low
line differ turn cause much mean before move right boy old too same tell does set three
want air well also play small end put home read hand port large spell add even land here
must big high such follow act why ask men change went light kind off need house picture
try us again animal point mother world near build self earth father model memory context
cache token tokens speed fast slow quant layer layers hello hi assistant user system
answer question yes thanks please json true false null name value
"""
WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class Vocabulary:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]


def _pieces(target_size: int) -> list[str]:
    chars = [c for c in string.printable if c not in " \t\n\r\x0b\x0c"]
    pieces: list[str] = [SPACE, *chars, *(SPACE + c for c in chars)]
    for word in WORDS:
        pieces += [SPACE + word[:k] for k in range(2, len(word) + 1)]
        pieces += [word[:k] for k in range(2, len(word) + 1)]
    letters = string.ascii_lowercase
    for length in (2, 3):
        for combo in itertools.product(letters, repeat=length):
            pieces.append("".join(combo))
            pieces.append(SPACE + "".join(combo))
    unique = list(dict.fromkeys(pieces))
    return unique[:target_size]


def build_vocabulary(n_vocab: int, added: tuple[str, ...] = ()) -> Vocabulary:
    """A vocabulary of exactly ``n_vocab`` tokens (at least 512).

    ``added`` tokens (e.g. ``<think>``) take the last ids as user-defined tokens, which
    llama.cpp matches as one token in plain text; every other id is what it is without them.
    """
    if n_vocab < 512:
        raise ValueError("a round-tripping vocabulary needs at least 512 tokens")
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    n_pieces = n_vocab - len(SPECIALS) - len(byte_tokens) - len(added)
    pieces = _pieces(n_pieces)
    filler = [f"<unused{i}>" for i in range(n_pieces - len(pieces))]
    tokens = (*SPECIALS, *byte_tokens, *pieces, *filler, *added)
    # longer pieces score higher so SPM prefers whole words
    scores = (
        (0.0,) * (len(SPECIALS) + 256)
        + tuple(float(len(p)) for p in pieces)
        + (-1e9,) * len(filler)
        + (0.0,) * len(added)
    )
    types = (
        (UNKNOWN,)
        + (CONTROL,) * (len(SPECIALS) - 1)
        + (BYTE,) * 256
        + (NORMAL,) * len(pieces)
        + (USER_DEFINED,) * (len(filler) + len(added))
    )
    return Vocabulary(tokens, scores, types)


# WordPiece (llama.cpp's "bert" tokenizer): BERT's specials, then word-initial pieces written
# with SPACE (as convert_hf_to_gguf turns "word") and continuations bare (as it turns "##ord").
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, WP_UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)


def build_wordpiece_vocabulary(n_vocab: int) -> Vocabulary:
    """An uncased WordPiece vocabulary of exactly ``n_vocab`` tokens (at least 512)."""
    if n_vocab < 512:
        raise ValueError("a WordPiece vocabulary needs at least 512 tokens")
    n_pieces = n_vocab - len(WORDPIECE_SPECIALS)
    lowercase = [p for p in _pieces(2 * n_vocab) if p == p.lower()]  # llama.cpp lowercases
    pieces = lowercase[:n_pieces]
    filler = [f"[unused{i}]" for i in range(n_pieces - len(pieces))]
    tokens = (*WORDPIECE_SPECIALS, *pieces, *filler)
    types = (
        (CONTROL, UNKNOWN, CONTROL, CONTROL, CONTROL)
        + (NORMAL,) * len(pieces)
        + (USER_DEFINED,) * len(filler)
    )
    return Vocabulary(tokens, (0.0,) * n_vocab, types)


# ChatML with Hermes-style tool calls; rendered by llama.cpp users and by homelab in a sandbox.
_SYSTEM_AND_TOOL_TURNS = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\nYou may call functions. Their signatures are inside <tools></tools>:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    'To call one, answer with <tool_call>{"name": <name>, "arguments": <args>}</tool_call>'
    "<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    '{% for call in message.tool_calls %}<tool_call>\n{"name": "{{ call.function.name }}", '
    '"arguments": {{ call.function.arguments if call.function.arguments is string '
    "else call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
)
_OTHER_TURNS = (
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
)
_GENERATION_PROMPT = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
CHAT_TEMPLATE = _SYSTEM_AND_TOOL_TURNS + _OTHER_TURNS + _GENERATION_PROMPT

# Reasoning (Qwen3's conventions): the reply opens a <think> block, or an empty one when the
# caller passes enable_thinking=false; earlier answers go back without their reasoning.
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_ANSWER_ONLY_TURNS = (
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{{ (message.content or '').split('</think>')[-1].lstrip('\\n') }}<|im_end|>\n"
)
_THINKING_PROMPT = (
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
REASONING_CHAT_TEMPLATE = (
    _SYSTEM_AND_TOOL_TURNS + _ANSWER_ONLY_TURNS + _OTHER_TURNS + _THINKING_PROMPT
)
