"""homelab.hub: the Hugging Face hub and the local library.

- :mod:`~homelab.hub.client` — the one doorway to the hub (search, repo listings, byte ranges),
  bounded in time and size, errors mapped to HubError;
- :mod:`~homelab.hub.quants` — a repo's GGUF files grouped by quant, split sets as one;
- :mod:`~homelab.hub.remote` — GGUF headers read remotely (plan before download);
- :mod:`~homelab.hub.matrix` — quant × KV type for this machine, from remote headers;
- :mod:`~homelab.hub.pull` — verified, resumable downloads into the Hugging Face cache;
- :mod:`~homelab.hub.library` — local models (library folders + HF cache), shared with the TUI;
- :mod:`~homelab.hub.local_quantize` — ``homelab quantize`` with provenance;
- :mod:`~homelab.hub.resolve` — ``REPO[:QUANT]``'s variants to plan over, the quant to pull;
- :mod:`~homelab.hub.search`, :mod:`~homelab.hub.render` — what the verbs ask, and its views.
"""
