"""homelab.models: MODEL as typed -> a model, and the one plan-then-load.

ref.py     :func:`~homelab.models.ref.resolve` (text -> :data:`~homelab.models.ref.ModelRef`):
           a GGUF path, a demo model, a local library name, a hub repo or a catalogue entry;
           what each plans over and which file it loads
fetch.py   :func:`~homelab.models.fetch.ensure_local`: a ref whose file is not here (a hub
           ref, a catalogue name) planned from its remote header, confirmed, downloaded
launch.py  :func:`~homelab.models.launch.open_engine`: plan the file for this machine, apply
           the serving overrides, load it with the plan's memory prediction
embeddings.py  the same for ``homelab serve`` with embeddings: an embedding model alone, or
           a generative one with an embedder beside it (its context's memory reserved first)

It sits above the engine, the hub and the planner (which never import it) and below the
server, bench, the TUI and the CLI, which all start models through it.
"""
