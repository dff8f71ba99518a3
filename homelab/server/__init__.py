"""homelab.server: the OpenAI- and Anthropic-compatible endpoint (``homelab serve``).

Adding a dialect: its wire types (pydantic, on :class:`~homelab.server.protocol.WireModel`,
validation only) go in ``<dialect>_protocol.py``; its route module ``<dialect>.py`` has one
public ``chat_inputs(request, ...) -> ChatInputs`` that maps the wire request to the one chat
preparation (:func:`~homelab.server.prompting.prepare_chat`), and shapes the parsed reply back
into its wire format. ``prompting.py`` holds only that one preparation; no dialect's mapping
lives in a wire-types module or in another dialect's module.

From the top (routes) down in the order of the import-linter contract "homelab.server layers"
(held by ``tests/test_import_contracts.py``): each module imports only from the ones below it,
and modules of one layer not from each other:

runner.py      start_server(...) -> ServerHandle (a background thread), uvicorn setup
app.py         create_app(engine_provider, config[, fleet]): routes, error handlers, middleware;
               parse_body -> serving_context (the engine, or the fleet's lease) -> the dialect
template_report.py   ``homelab template``: chat's mapping and the reply parser, without a model
chat.py        POST /v1/chat/completions          \
completions.py POST /v1/completions                | each maps its wire request into the
anthropic.py   POST /v1/messages (+ count_tokens)  | one preparation (chat_inputs), and the
responses.py   POST /v1/responses                  | reply back into its wire shape
embeddings.py  POST /v1/embeddings                 /
slots_admin.py /admin/slots: save, restore, erase a slot's prompt cache
responses_stream.py   the Responses API's events
responses_output.py   the Responses API's output items
prompting.py   the one chat preparation: template, tools, grammar, thinking, render, tokenize
replies.py     one choice's output parsed as it streams: reasoning, answer, tool calls
reasoning.py   reasoning formats (<think>, gpt-oss channels) and their streaming splitters
tools/         tool calls: parse as they stream (a whole message too), force with a grammar
chat_images.py image parts -> the projector's marker; tokenized with the images
serving.py     engine-facing checks, sampling, submitting / collecting choices, usage, ids
fleet.py       several models behind one endpoint: load on demand, planner-decided residency,
               LRU eviction of idle models, keep-alive, leases held for a response's duration
middleware.py  request log/metrics, tenant gate, body-size cap (pure ASGI)
streaming.py   server-sent events (one writer), cancelled when the client leaves
config.py      ServerConfig
metrics.py     Prometheus text exposition
anthropic_protocol.py, responses_protocol.py   wire types (strict validation)
response_store.py   stored responses per tenant (previous_response_id), bounded, a share each, a TTL
body_shape.py  a body's JSON values counted (numpy, GIL let go) before the parse that holds it
protocol.py    OpenAI's wire types, and WireModel: the base of every dialect's wire types
auth.py        keys file (hashes -> tenants), per-tenant limits
errors.py      one error type; exception type -> HTTP status; each dialect's envelope
pieces.py      what a reply is parsed into: ContentDelta, ReasoningDelta, ToolCall
engine_seam.py the engine as the server sees it (typed protocols)
history.py     history made cache-stable: volatile system text out, earlier reasoning back
image_parts.py images in request content: data URLs (http(s) if allowed), limits, decoding
(the ``serve`` verb is :mod:`homelab.cli.serve`)
"""
