"""homelab: run large language models that "shouldn't fit" on one consumer GPU.

The core packages (hardware, gguf, planner, engine, server, hub, bench) are headless;
only ``homelab.tui`` imports Textual.
"""

__version__ = "0.1.0"
