"""homelab.bench: measure this machine and the plan's quality cost (headless; the CLI and the
TUI both call it). The verbs are ``homelab.cli.bench`` and ``homelab.cli.quality``.

measure.py      `homelab bench`: BenchOptions -> BenchOutcome (speed, table, saved profile)
plan_quality.py `homelab quality`: QualityOptions -> the plan's quality cost, saved
profile.py      pp512 / tg128 of one configuration: warm-up, repeated runs, median and spread
concurrency.py  the concurrency × K/V-type table (fits from the planner, figures measured)
planning.py     what bench asks the planner: the planned settings, per-cell fits, --budget
prompts.py      distinct token windows and tenants, so no request hits another's prefix cache
quality.py      KL divergence, top-1 agreement and perplexity against a reference (llama.cpp)
weights.py      sibling quant files of a model and the most precise one
store.py        hardware profiles (read by the planner) and the last quality result (TUI)
render.py       tables, the terminal chart and the progress bar (rich)
"""
