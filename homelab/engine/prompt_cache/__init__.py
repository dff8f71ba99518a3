"""A prompt cache that outlives its slot: sequence states in host RAM, then on disk.

A slot's K/V cells are lost when the slot is handed to other work, when the model is closed
(the fleet evicts it, the server stops) and when the process ends. This package keeps them:

    key          ModelKey: the model's identity (GGUF headers, size, data samples) and the
                 cache layout that shapes a state (K/V types, flash attention, cells per
                 slot, streams, swa_full); a tenant's identity (its name and generation)
    entry        StateEntry: (model, tenant, tokens) -> state bytes, and the lookup rule
    disk         the file format (header with the whole key, SHA-256 trailer; written to a
                 temp file and renamed, 0600 in 0700 folders) and the size-capped disk tier
    shares       each tenant's share of the RAM budget and the disk cap: room is made first
                 from the tenant most over its share
    store        PromptCache: the process-wide RAM tier (a byte budget, least recently used
                 out first — to disk, by a writer thread: the lane never waits on the disk)
                 over the disk tier, expiry after a TTL, hit counts
    slot_states  SlotStates: one engine's side — save a slot before it loses its prefix,
                 restore the tenant's longest cached prefix when that beats prefilling

A state is looked up only under the requesting tenant's identity and the loading engine's
ModelKey, so one tenant's cache never serves another (nor a new holder of a name the old
holder's), and a state never reaches another model or layout.
Recurrent and hybrid models are refused (their state cannot be cut back to a shorter prefix,
so a saved state would serve only prompts that extend it whole); sliding-window models work,
with the same window check the slot table makes.
"""
