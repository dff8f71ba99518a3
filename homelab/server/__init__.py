"""homelab.server: the OpenAI-compatible endpoint (``homelab serve``).

protocol.py    wire types (strict validation, unknown fields ignored)
errors.py      the OpenAI error envelope; exception type -> HTTP status
auth.py        keys file (hashes -> tenants), per-tenant limits
middleware.py  request log/metrics, tenant gate, body-size cap (pure ASGI)
serving.py     engine-facing checks, submitting and collecting choices
chat.py, completions.py   the two generation routes
tools.py       tool-call grammar and streamed tool-call parsing
responses*.py  /v1/responses: wire types -> the chat path; response items; response.* events
embeddings.py  /v1/embeddings; embeddings_setup.py: what serve loads for them (and plans)
streaming.py   server-sent events, cancelled when the client leaves
metrics.py     Prometheus text exposition
fleet.py       several models behind one endpoint: load on demand, planner-decided residency,
               LRU eviction of idle models, keep-alive, leases held for a response's duration
app.py         create_app(engine_provider, config[, fleet])
runner.py      start_server(...) -> ServerHandle (a background thread), uvicorn setup
(the ``serve`` verb is :mod:`homelab.cli.serve`)
"""
