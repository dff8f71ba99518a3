"""The help screen: what each panel shows and every key."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP_TEXT = """\
# homelab

Runs a large language model on this machine with llama.cpp: it **plans** how the model fits
(quant, KV cache type, context, slots, offload), **loads** it, lets you **chat** with it and
**serves** an OpenAI-compatible endpoint — with live tokens/s.

## Panels

- **Hardware** — each GPU's memory: *ours* (this process), *other processes*, *free*;
  temperature, power, utilisation; CPU and RAM. Refreshed every second. With `--rpc`, each
  RPC worker's devices and their free memory (the plan uses them).
- **Model & plan** — the chosen settings and how memory is shared on each device
  (weights / KV cache / compute / overhead / free). Turn a knob and it re-plans at once,
  before anything is loaded. *Context reachable* is the longest context per slot with
  f16, q8_0 or q4_0 KV cache.
- **Live run** — decode and prefill tokens/s, time to first token, slots, queue, KV cells;
  with speculative decoding (`--spec ngram`, `--draft MODEL`) the share of drafted tokens
  accepted and the tokens each target step yields. `ctrl+y` gives the GPU back: the model is
  closed, its conversations kept in the prompt cache; again, it is re-planned for the VRAM
  free then and loaded. The panel shows why, and each yield's cause, time, bytes freed and
  saved, time to resume; the server, if running, holds its requests meanwhile (then 503).
- **Chat** — type a prompt, Enter sends it, Esc (or ctrl+x) cancels the answer. Whenever the
  chat is on screen at start, or its page is opened, the prompt has the focus: what you type
  goes to the model. Esc leaves the box. `/image PATH` attaches an image to the next prompt
  (a model with its vision projector): its name, size, pixels and tokens are shown.
- **Server** — starts the OpenAI endpoint; lists the model it has loaded (planned and
  allocated memory) with an *Unload* button; the log shows status, tenant, tokens and tok/s
  (never prompt text).

## Keys

These work anywhere, also while you type in the prompt:

| key | action |
|-----|--------|
| `ctrl+o` | pick a model (local files, catalogue, demo) |
| `ctrl+l` | load the planned model (again: unload) |
| `ctrl+s` | start / stop the server |
| `ctrl+y` | give the GPU back to a game or ComfyUI (chats kept); again: take it back |
| `ctrl+x` (in the prompt: `esc` too) | cancel the answer being generated |
| `ctrl+p` | command palette (every action) |
| `F1` | this help |
| `ctrl+q` | quit |

Outside the prompt (after Esc), single letters work too:

| key | action |
|-----|--------|
| `m` / `l` / `s` / `y` | pick a model / load / server / yield the GPU, as above |
| `i` | write a prompt |
| `k` / `c` / `p` | cycle KV type / context / slots |
| `r` | re-detect the hardware |
| `u` | unload the model (and stop the server serving it) |
| `1`–`4` | pages on a small terminal: overview, plan, chat (its prompt takes the keys), server |
| `?` / `q` | this help / quit |

The **trained demo model** (the default when no other model is on this machine) is a
2.6M-parameter llama trained here on Python's documentation: it writes simple English and
knows nothing. The other **demo models** have random weights: they run for real on llama.cpp,
so tokens/s are real, but their answers are gibberish. Pick a real model with `ctrl+o`, or
`homelab pull`.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark,f1", "dismiss", "Close"),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 96; height: 90%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = "Help"
            scroll.border_subtitle = "esc to close"
            yield Markdown(HELP_TEXT)
