"""homelab.server: the OpenAI- and Anthropic-compatible endpoint (``homelab serve``).

From the top (routes) down; each module imports only from the ones below it
(``tests/test_import_contracts.py`` holds the order):

app.py         create_app(engine_provider, config[, fleet]): routes, error handlers, middleware;
               parse_body -> serving_context (the engine, or the fleet's lease) -> the dialect
runner.py      start_server(...) -> ServerHandle (a background thread), uvicorn setup
chat.py        POST /v1/chat/completions          \
completions.py POST /v1/completions                | each maps its wire request into the
anthropic.py   POST /v1/messages (+ count_tokens)  | one preparation, and the reply back
responses.py   POST /v1/responses                  | into its wire shape
embeddings.py  POST /v1/embeddings                /
responses_stream.py, responses_output.py   the Responses API's events and output items
prompting.py   the one chat preparation: template, tools, grammar, thinking, render, tokenize
replies.py     one choice's output parsed as it streams: reasoning, answer, tool calls
reasoning.py   reasoning formats (<think>, gpt-oss channels) and their streaming splitters
tools/         tool calls: parse (whole, streamed), force with a grammar
pieces.py      what a reply is parsed into: ContentDelta, ReasoningDelta, ToolCall
serving.py     engine-facing checks, sampling, submitting / collecting choices, usage, ids
fleet.py       several models behind one endpoint: load on demand, planner-decided residency,
               LRU eviction of idle models, keep-alive, leases held for a response's duration
engine_seam.py the engine as the server sees it (typed protocols)
streaming.py   server-sent events (one writer), cancelled when the client leaves
middleware.py  request log/metrics, tenant gate, body-size cap (pure ASGI)
auth.py        keys file (hashes -> tenants), per-tenant limits
metrics.py     Prometheus text exposition
protocol.py, anthropic_protocol.py, responses_protocol.py   wire types (strict validation)
errors.py      one error type; exception type -> HTTP status; each dialect's envelope
config.py      ServerConfig
(the ``serve`` verb is :mod:`homelab.cli.serve`)
"""
