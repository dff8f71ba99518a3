"""homelab.tui — the Textual dashboard; the only package that imports Textual.

Layout: ``app.py`` (the app, its state and workers), ``screens/`` (dashboard, model picker,
help, error modal), ``widgets/`` (one module per dashboard region), ``app.tcss`` (the one
stylesheet). ``services.py`` and ``live.py`` are Textual-free adapters over the headless core
(hardware, planner, engine, server, hub) so the UI code only ever renders their results.
"""
