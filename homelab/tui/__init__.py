"""homelab.tui — the Textual dashboard; the only package that imports Textual.

Layout: ``app.py`` (the composition root: keys, palette, message routing), ``panels/`` (one
controller per panel — hardware, plan, live, chat, server, picker — owning its state and
workers), ``messages.py`` (every message), ``screens/`` (dashboard, model picker, help, error
modal), ``widgets/`` (one module per dashboard region), ``app.tcss`` (the one stylesheet).
``services.py``, ``protocols.py`` (what the TUI uses of the core, as Protocols) and
``handoff.py`` (values handed from worker threads to the UI loop) are Textual-free, so the UI
code only ever renders the core's results.
"""
