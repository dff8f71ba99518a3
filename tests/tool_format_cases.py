"""What the tool-format tests run on: each real template's rendering of an assistant turn
with tool calls, cut to what the model itself writes, and a token stream of it.

The calls' arguments cover nested objects, arrays, numbers, booleans, null, unicode, quotes,
newlines, markup and an empty object; the tools' schemas type them (formats that write
arguments as raw text are typed by the schema, as in serving).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from template_corpus import templates_dir, vocab_file

from homelab.engine.chat_template import ChatTemplate
from homelab.llamacpp.model import Model, ModelParams

CONTENT, REASONING = "Let me check.", "Need data."
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "note": {"type": "string"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array"},
        "opts": {"type": "object"},
    },
}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": "d", "parameters": SCHEMA}}
    for name in ("get_weather", "search")
]
ARGUMENTS: list[dict[str, Any]] = [
    {"city": "Paris", "days": 3},
    {
        "city": 'Zürich "Q" 東京',
        "note": "line1\nline2 <b>x</b> {not json}",
        "ok": True,
        "tags": [1, "x", 2.5, False],
        "opts": {"a": {"b": [], "c": None}, "n": -7},
    },
    {},
]
EXPECTED_CALLS = [("get_weather" if i % 2 == 0 else "search", a) for i, a in enumerate(ARGUMENTS)]

# Turn ends the model writes as control tokens (not part of its text).
TURN_ENDS = (
    "<|im_end|>", "</s>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<｜end▁of▁sentence｜>",
    "<|end_of_text|>", "[e~[", "<end_of_sentence>", "<seed:eos>", "<|role_end|>",
    "</assistant>", "<|calls|>", "<turn|>", "<|tool_response>", "<|END_OF_TURN_TOKEN|>",
    "<|message_sep|>", "<SPECIAL_12>", "<sep>", "<｜hy_eos:opensource｜>", "<|end_of_msg|>",
)  # fmt: skip

# The family's real tokenizer, by template name prefix (others stream character by character).
VOCABS = {
    "Qwen3.5": "qwen35",
    "Qwen": "qwen2",
    "MiMo": "qwen2",
    "NousResearch": "llama-bpe",
    "meta-llama": "llama-bpe",
    "meetkai": "llama-bpe",
    "Cohere": "command-r",
    "deepseek": "deepseek-llm",
    "google-gemma-4": "gemma-4",
}


@dataclass(frozen=True)
class Case:
    template: str
    n_calls: int
    output: str  # what the model writes for the assistant turn
    prompt: str  # the generation prompt before it
    source: str

    @property
    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        return EXPECTED_CALLS[: self.n_calls]


@cache
def template(name: str) -> ChatTemplate:
    return ChatTemplate((templates_dir() / f"{name}.jinja").read_text(), "<s>", "</s>")


def tool_templates() -> Iterator[str]:
    for path in sorted(templates_dir().glob("*.jinja")):
        if template(path.stem).supports_tools:
            yield path.stem


def case(name: str, n_calls: int, *, with_text: bool = True) -> Case:
    """The assistant turn with ``n_calls`` calls (and content and reasoning ``with_text``)."""
    chat = template(name)
    calls = [
        {"id": f"call{i:05d}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(EXPECTED_CALLS[:n_calls])
    ]
    turn: dict[str, Any] = {"role": "assistant", "content": ""}
    if with_text:
        turn = {"role": "assistant", "content": CONTENT, "reasoning_content": REASONING}
    messages = [{"role": "user", "content": "hi"}, {**turn, "tool_calls": calls}]
    prompt = chat.render(messages[:1], tools=TOOLS, add_generation_prompt=True)
    history = chat.render(messages, tools=TOOLS, add_generation_prompt=False)
    output, prompt = _assistant_text(chat, messages, prompt, history)
    harmony = "<|channel|>" in chat.source  # <|end|> closes a channel there, not the turn
    ends = [at for end in TURN_ENDS if (at := output.find(end)) >= 0 and not harmony]
    return Case(name, n_calls, output[: min(ends, default=len(output))], prompt, chat.source)


def _assistant_text(
    chat: ChatTemplate, messages: list[dict[str, Any]], prompt: str, history: str
) -> tuple[str, str]:
    """The turn after the generation prompt; when the history renders the turn's header
    differently (a think block the prompt opens), the turn from its header's end on."""
    if history.startswith(prompt):
        return history[len(prompt) :], prompt
    before = chat.render(messages[:1], tools=TOOLS, add_generation_prompt=False)
    header, turn = prompt[len(before) :], history[len(before) :]
    same = 0
    while same < min(len(header), len(turn)) and header[same] == turn[same]:
        same += 1
    while same and header[same - 1] not in "\n>":
        same -= 1
    return turn[same:], before + header[:same]


@cache
def _tokenizer(name: str) -> Model:
    return Model.load(vocab_file(name), ModelParams(n_gpu_layers=0, vocab_only=True))


def token_texts(name: str, text: str) -> list[str]:
    """``text`` as the family's tokenizer splits it (control tokens included), each token's
    text as the engine releases it (a character split across tokens waits for its end)."""
    vocab = next((v for prefix, v in VOCABS.items() if name.startswith(prefix)), None)
    if vocab is None:
        return list(text)
    model = _tokenizer(vocab)
    tokens = model.vocab.tokenize(text, add_bos=False, parse_special=True)
    pieces: list[str] = []
    pending = b""
    for token in tokens:
        pending += model.vocab.token_bytes(token, special=True)
        try:
            pieces.append(pending.decode())
            pending = b""
        except UnicodeDecodeError:
            pieces.append("")
    assert "".join(pieces) == text, "the tokenizer does not round-trip this text"
    return pieces


def arguments_of(fragments: list[str]) -> Any:
    return json.loads("".join(fragments))
