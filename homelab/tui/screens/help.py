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
  temperature, power, utilisation; CPU and RAM. Refreshed every second.
- **Model & plan** — the chosen settings and how memory is shared on each device
  (weights / KV cache / compute / overhead / free). Turn a knob and it re-plans at once,
  before anything is loaded. *Context reachable* is the longest context per slot with
  f16, q8_0 or q4_0 KV cache.
- **Live run** — decode and prefill tokens/s, time to first token, slots, queue, KV cells.
- **Chat** — type a prompt, Enter sends it, Esc (or ctrl+x) cancels the answer.
- **Server** — starts the OpenAI endpoint; the log shows status, tenant, tokens and tok/s
  (never prompt text).

## Keys

| key | action |
|-----|--------|
| `m` | pick a model (local files, catalogue, demo) |
| `l` | load the planned model (again: unload) |
| `i` | write a prompt |
| `esc`, `ctrl+x` | cancel the answer being generated |
| `s` | start / stop the server |
| `k` / `c` / `p` | cycle KV type / context / slots |
| `1`–`4` | pages on a small terminal: overview, plan, chat, server |
| `ctrl+p` | command palette (every action) |
| `?` | this help |
| `q` | quit |

A **demo model** has random weights: it runs for real on llama.cpp, so tokens/s are real,
but its answers are gibberish. Pick a real model with `m`, or `homelab pull`.
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
