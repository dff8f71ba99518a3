"""``homelab serve [MODEL]``: an OpenAI-compatible endpoint for one model, or for several.

Without MODEL it serves the local library (``homelab models``), or the models ``--models``
names: a request's ``model`` picks one, loaded on its first request; the planner decides which
stay loaded together (see :mod:`homelab.server.fleet`); ``--keep-alive`` unloads idle ones.
Each model is planned with ``--goal quality`` (for ``--ctx``, default 8192) unless ``--goal``
is given: the longest context that fits would leave no room for a second model.

Listens on 127.0.0.1:8080 by default. Binding any other address needs API keys: when the
keys file (``config_dir()/keys.toml`` or ``--api-key-file``) does not exist yet, one key is
generated, its hash stored (mode 0600) and the key printed once. ``--new-key TENANT`` adds a
key for a tenant and exits; ``--remove-keys TENANT`` removes every key of a tenant, and with
them what is kept for it (a running server re-reads the keys file and deletes its slots,
prompt states and stored responses; with none running, its states in the data folder go).
A name given a key again is a new identity: nothing of the old holder's is found.

MODEL is any form ``homelab plan`` takes that has a file on this machine. It is resolved and
planned like ``homelab plan`` (the same flags) before anything is announced, so a missing
model or a plan that cannot fit fails at once with its error; then the server starts
listening (``/health`` answers 503 while the model loads) and says where it serves.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homelab.cli import flags, yield_flags
from homelab.cli import prompt_cache as prompt_cache_cli

if TYPE_CHECKING:
    from homelab.engine.prompt_cache.store import PromptCache
    from homelab.models.launch import Overrides
    from homelab.models.ref import ModelRef
    from homelab.planner.budget import Hardware
    from homelab.planner.plan import Plan
    from homelab.server.auth import KeyFile
    from homelab.server.config import ServerConfig
    from homelab.server.fleet import Fleet, Servable
    from homelab.server.runner import EngineHolder

DEFAULT_PORT = 8080
# Several models: plan each for --ctx (default 8192, within its trained context) at the best
# quality that reaches it, rather than for the longest context that fits (goal "context"),
# which would give the first model every byte and never let two share the machine.
FLEET_GOAL = "quality"
AGENT_MIN_CONTEXT = 65_536  # Claude Code, Codex, OpenCode: 10-30K of prompt before any work


def configure(parser: argparse.ArgumentParser) -> None:
    flags.add_model(parser, optional=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port ({DEFAULT_PORT})")
    _add_key_flags(parser)
    parser.add_argument("--model-id", help="the model name clients use (default: the file name)")
    parser.add_argument(
        "--max-body-bytes", type=int, default=32 * 1024 * 1024, help="request body cap (32 MiB)"
    )
    parser.add_argument(
        "--max-images", type=int, default=16, help="images one chat request may carry (16)"
    )
    parser.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch http(s) image URLs clients send, public addresses only (10 s, 20 MiB "
        "each; off: data URLs only)",
    )
    parser.add_argument(
        "--allow-private-image-urls",
        action="store_true",
        help="also fetch image URLs on loopback, LAN and link-local addresses (trusted "
        "clients only: they can make the server reach what only it can)",
    )
    parser.add_argument(
        "--default-max-tokens", type=int, default=2048, help="chat max_tokens when unset"
    )
    _add_stored_response_flags(parser)
    parser.add_argument("--cors-origin", action="append", default=[], help="allowed browser origin")
    parser.add_argument("--log-prompts", action="store_true", help="log prompts and outputs (off)")
    parser.add_argument(
        "--reasoning-format",
        choices=("auto", "deepseek", "none"),
        default="auto",
        help="reasoning models: return the thinking apart as reasoning_content (auto, deepseek) "
        "or leave it in the content (none)",
    )
    parser.add_argument(
        "--no-think",
        action="store_true",
        help="templates with an enable_thinking switch: thinking off unless a request turns it on",
    )
    parser.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="PATTERN=MODEL",
        help="a requested model name matching PATTERN (fnmatch, e.g. 'claude-*') means MODEL "
        "(repeatable; also [aliases] in serve.toml)",
    )
    parser.add_argument(
        "--strip-pattern",
        action="append",
        default=[],
        metavar="REGEX",
        help="remove text matching REGEX from system messages before rendering (volatile client "
        "blocks; Claude Code's billing header is always removed)",
    )
    parser.add_argument(
        "--no-history-reasoning",
        action="store_true",
        help="drop earlier turns' reasoning instead of rendering it back (it keeps the prefix "
        "cache valid for reasoning models)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="serve settings file ([aliases], [prompt]; default: config dir serve.toml)",
    )
    parser.add_argument(
        "--embeddings",
        choices=("mean", "cls", "last"),
        help="also serve /v1/embeddings from a generative model, with this pooling",
    )
    parser.add_argument(
        "--models",
        metavar="NAME,NAME…",
        help="without MODEL: serve these models (default: every model `homelab models` lists); "
        f"each is planned with --goal {FLEET_GOAL} unless --goal says otherwise",
    )
    parser.add_argument(
        "--keep-alive",
        metavar="DURATION",
        default="10m",
        help="without MODEL: unload a model idle this long (10m; 0: when idle; -1: never)",
    )
    flags.add_plan_flags(parser)
    flags.add_engine_flags(parser)
    flags.add_speculation_flags(parser)
    flags.add_download_flags(parser)
    prompt_cache_cli.add_flags(parser)
    yield_flags.add_flags(parser)
    parser.set_defaults(goal=None)  # resolved in run(): one model or several (FLEET_GOAL)


def _add_key_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key-file", type=Path, help="keys file (default: config dir keys.toml)"
    )
    parser.add_argument(
        "--new-key", metavar="TENANT", help="add an API key for TENANT, print it, exit"
    )
    parser.add_argument(
        "--admin", action="store_true", help="with --new-key: the tenant may read /metrics"
    )
    parser.add_argument(
        "--remove-keys",
        metavar="TENANT",
        help="remove every API key of TENANT (and its prompt states, stored responses), exit",
    )


def _add_stored_response_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("stored responses (the Responses API's store)")
    group.add_argument(
        "--stored-responses", type=int, default=256, metavar="N", help="kept at most (256)"
    )
    group.add_argument(
        "--stored-responses-mib", type=int, default=64, metavar="MIB", help="their JSON (64)"
    )
    group.add_argument(
        "--stored-responses-tenant-share",
        type=float,
        default=0.25,
        metavar="FRACTION",
        help="each tenant's share of both: when the store is full, the tenant most over its "
        "share loses its oldest (0.25)",
    )


def run(args: argparse.Namespace) -> int:
    from homelab.errors import ConfigError
    from homelab.server.auth import add_key, default_keys_path

    keys_path = args.api_key_file or default_keys_path()
    if args.new_key:
        key = add_key(keys_path, args.new_key, admin=args.admin)
        _announce_key(args, keys_path, args.new_key, key)
        return 0
    if args.remove_keys:
        return _remove_keys(args, keys_path)
    if args.model and args.models:
        raise ConfigError("give a MODEL or --models, not both.")
    if not args.model and (args.spec or args.draft):
        raise ConfigError("--spec and --draft need a MODEL: a draft drafts for one target.")
    if not args.model and args.yield_to_cpu:
        raise ConfigError(
            "--yield-to-cpu needs a MODEL: it serves one model from the CPU while yielded.",
            hint="Give the MODEL to serve, or leave --yield-to-cpu out.",
        )
    if not args.model:
        return _serve_fleet(args, keys_path)
    if args.goal is None:
        args.goal = "context"
    return _serve(args, keys_path)


def _serve(args: argparse.Namespace, keys_path: Path) -> int:
    from homelab.models.launch import plan_file
    from homelab.server.app import create_app
    from homelab.server.runner import EngineHolder, bind_socket, run_holding_lock, uvicorn_server

    request, hardware = flags.plan_request(args), flags.hardware(args)
    hardware, cache_ram_bytes = prompt_cache_cli.reserve(args, hardware)
    ref = flags.local_model(args, request, hardware)  # downloaded (or refused) before announcing
    model_path = ref.local_path()
    from homelab.models.embeddings import planning_hardware

    embeddings = getattr(args, "embeddings", None)
    plan = plan_file(ref, request, planning_hardware(model_path, hardware, embeddings))
    keys, new_key = _keys_for(args, keys_path)
    config = _config(args, model_path, keys)
    _check_aliases(config, [config.model_id, *config.model_aliases])
    sock = bind_socket(args.host, args.port)
    config = replace(config, port=sock.getsockname()[1])  # --port 0: the port it got
    _setup_logging()
    holder = EngineHolder()
    prompt_cache = prompt_cache_cli.open_cache(args, cache_ram_bytes)
    yielding = _model_yielding(
        args, holder, ref, plan, config.model_id, cache_ram_bytes, prompt_cache
    )
    app = create_app(holder, config, prompt_cache=prompt_cache, yielding=yielding)
    server = uvicorn_server(app)
    loader = threading.Thread(
        target=_load,
        args=(holder, ref, plan, flags.overrides(args), server, embeddings, prompt_cache),
        daemon=True,
    )
    loader.start()
    _announce_start(args, config, keys_path, new_key, plan)
    if not args.json:
        print(prompt_cache_cli.describe(prompt_cache), flush=True)
    _stop_in_order_on_signals()
    try:
        run_holding_lock(server, sock, f"http://{args.host}:{config.port}")
    finally:
        if holder.engine is not None:
            holder.engine.close()  # type: ignore[attr-defined]
        if prompt_cache is not None:
            prompt_cache.close()  # what is only in RAM goes to disk, for the next start
    if holder.failure is not None:
        raise holder.failure
    return 0


def _model_yielding(
    args: argparse.Namespace,
    holder: EngineHolder,
    ref: ModelRef,
    plan: Plan,
    name: str,
    cache_ram_bytes: int,
    prompt_cache: PromptCache | None,
) -> Any:
    """Yield and resume for the one model: re-planned like at start, for the VRAM free then."""
    from homelab.models.embeddings import load_serving_engine, planning_hardware
    from homelab.models.launch import plan_file
    from homelab.server.yield_targets import plan_for_cpu

    request, overrides = flags.plan_request(args), flags.overrides(args)
    embeddings, model_path = getattr(args, "embeddings", None), ref.local_path()

    def plan_now(hardware: Hardware) -> Plan:
        return plan_file(ref, request, planning_hardware(model_path, hardware, embeddings))

    def load(planned: Plan) -> Any:
        return load_serving_engine(ref, planned, overrides, embeddings, prompt_cache)

    def plan_on_cpu(host_only: Hardware, like: Plan) -> Plan:
        hardware = planning_hardware(model_path, host_only, embeddings)
        return plan_for_cpu(lambda asked: plan_file(ref, asked, hardware), request, like)

    return yield_flags.for_model(
        args, holder, name, plan, plan_now, load, cache_ram_bytes, prompt_cache, plan_on_cpu
    )


def _stop_in_order_on_signals() -> None:
    """uvicorn re-raises the signal that stopped it once it has shut down. SIGTERM under its
    default action would kill the process before the engines are closed: make it an orderly
    exit 0. SIGINT under Python's default handler goes to asyncio's runner, which swallows it
    when its task has just finished (Ctrl-C then exited 0 now and then, seen under load): our
    own handler lets it reach the CLI, which exits 130 as for every verb."""

    def stop(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, interrupt)


def _serve_fleet(args: argparse.Namespace, keys_path: Path) -> int:
    """Several models: each loads on its first request, as the planner lets them share."""
    from homelab.server.app import create_app
    from homelab.server.runner import bind_socket, run_holding_lock, uvicorn_server

    cache_ram_bytes = prompt_cache_cli.ram_bytes(args, flags.hardware(args))
    prompt_cache = prompt_cache_cli.open_cache(args, cache_ram_bytes)
    fleet = build_fleet(args, prompt_cache)
    keys, new_key = _keys_for(args, keys_path)
    config = _config(args, Path("homelab"), keys)
    _check_aliases(config, fleet.names())
    sock = bind_socket(args.host, args.port)
    config = replace(config, port=sock.getsockname()[1])
    _setup_logging()
    yielding = yield_flags.for_fleet(args, fleet, prompt_cache)
    app = create_app(lambda: None, config, fleet, prompt_cache=prompt_cache, yielding=yielding)
    server = uvicorn_server(app)
    _announce_fleet(args, config, fleet.names(), keys_path, new_key)
    if not args.json:
        print(prompt_cache_cli.describe(prompt_cache), flush=True)
    _stop_in_order_on_signals()
    try:
        run_holding_lock(server, sock, f"http://{args.host}:{config.port}")
    finally:
        fleet.close()
        if prompt_cache is not None:
            prompt_cache.close()
    return 0


def build_fleet(args: argparse.Namespace, prompt_cache: PromptCache | None = None) -> Fleet:
    """The models ``serve`` without MODEL serves, planned with its plan flags for the machine
    as it is now (before anything is loaded) and loaded as ``serve MODEL`` loads one; they
    share ``prompt_cache`` (a model evicted and loaded again finds its states), whose RAM
    the plans leave alone."""
    from homelab.models.embeddings import load_serving_engine, planning_hardware
    from homelab.models.launch import plan_file
    from homelab.server.fleet import Fleet, parse_keep_alive

    keep_alive_s = parse_keep_alive(args.keep_alive)
    if args.goal is None:  # each model planned for its context, leaving room for the others
        args.goal = FLEET_GOAL
    request, hardware = flags.plan_request(args), flags.hardware(args)
    if prompt_cache is not None:
        hardware = prompt_cache_cli.reserve_bytes(hardware, prompt_cache.config.ram_budget_bytes)
    embeddings, overrides = getattr(args, "embeddings", None), flags.overrides(args)

    def plan(model: Servable, left: Hardware) -> Plan:
        return plan_file(model.ref, request, planning_hardware(model.path, left, embeddings))

    def load(model: Servable, planned: Plan) -> Any:
        return load_serving_engine(model.ref, planned, overrides, embeddings, prompt_cache)

    return Fleet(_servables(args), hardware, plan, load, keep_alive_s=keep_alive_s)


def _servables(args: argparse.Namespace) -> list[Servable]:
    """``--models`` (each any MODEL form with a file here), else the whole local library."""
    from homelab.errors import ConfigError, HomelabError
    from homelab.hub.library import library_dirs, list_local_models
    from homelab.models.ref import from_library, resolve
    from homelab.server.fleet import Servable

    servables: list[Servable] = []
    if args.models:
        for text in (t.strip() for t in args.models.split(",")):
            if text:
                ref = resolve(text)
                servables.append(Servable(text, ref.local_path(), ref))
        return servables
    for model in list_local_models():
        try:
            servables.append(Servable(model.name, model.path, from_library(model, model.name)))
        except HomelabError:
            continue  # unreadable: `homelab models` says why
    if not servables:
        folders = ", ".join(str(f) for f in library_dirs())
        raise ConfigError(
            "homelab serve found no models to serve: the local library is empty.",
            hint=f"Give a MODEL ({flags.MODEL_HELP}), `homelab pull` one, or put GGUF files "
            f"in {folders} (or a folder in HOMELAB_MODEL_DIRS).",
        )
    return servables


def _announce_fleet(
    args: argparse.Namespace,
    config: ServerConfig,
    names: list[str],
    keys_path: Path,
    new_key: str | None,
) -> None:
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{host}:{config.port}/v1"
    if args.json:
        doc: dict[str, Any] = {"base_url": url, "models": names, "auth": config.keys is not None}
        if new_key:
            doc.update(api_key=new_key, tenant="default", keys_file=str(keys_path))
        print(json.dumps(doc), flush=True)
        return
    if new_key:
        _announce_key(args, keys_path, "default", new_key)
    auth = "API keys required" if config.keys is not None else "no API key needed (loopback only)"
    print(f"Serving {len(names)} models at {url} ({auth}); each loads on its first request:")
    for name in names:
        print(f"  {name}")
    print("`homelab ps` shows what is loaded.", flush=True)


def _config(args: argparse.Namespace, model_path: Path, keys: KeyFile | None) -> ServerConfig:
    from homelab.locations import config_dir
    from homelab.server.config import (
        SERVE_FILE_NAME,
        ServerConfig,
        parse_alias,
        read_serve_file,
    )
    from homelab.server.history import DEFAULT_VOLATILE_PATTERNS
    from homelab.units import MIB

    file = read_serve_file(args.config or config_dir() / SERVE_FILE_NAME)
    aliases = tuple(parse_alias(a) for a in args.alias) + file.aliases  # flags match first
    patterns = DEFAULT_VOLATILE_PATTERNS + file.strip_patterns + tuple(args.strip_pattern)
    return ServerConfig(
        aliases=aliases,
        volatile_patterns=patterns,
        history_reasoning=file.history_reasoning and not args.no_history_reasoning,
        model_id=args.model_id or model_path.stem,
        model_aliases=_typed_name(args, args.model_id or model_path.stem),
        host=args.host,
        port=args.port,
        keys=keys,
        max_body_bytes=args.max_body_bytes,
        max_images=args.max_images,
        allow_image_urls=args.allow_image_urls,
        allow_private_image_urls=args.allow_private_image_urls,
        default_max_tokens=args.default_max_tokens,
        log_prompts=args.log_prompts,
        cors_origins=tuple(args.cors_origin),
        reasoning_format=args.reasoning_format,
        enable_thinking=False if args.no_think else None,
        stored_responses=args.stored_responses,
        stored_response_bytes=args.stored_responses_mib * MIB,
        stored_response_tenant_share=args.stored_responses_tenant_share,
    )


def _typed_name(args: argparse.Namespace, model_id: str) -> tuple[str, ...]:
    """The MODEL as typed (``qwen2.5:7b``, ``demo:bench:Q8_0``, a path): requests may name it
    too, as Ollama's clients do; ``/v1/models`` lists ``model_id``."""
    typed = getattr(args, "model", None)
    return (typed,) if isinstance(typed, str) and typed and typed != model_id else ()


def _check_aliases(config: ServerConfig, served: list[str]) -> None:
    """An alias must lead to a model this server serves (else every request it catches 404s)."""
    from homelab.errors import ConfigError

    for pattern, model in config.aliases:
        if model not in served:
            raise ConfigError(
                f"--alias {pattern}={model}: this server serves no model named '{model}'.",
                hint=f"Name one of: {', '.join(served)}.",
            )


def _load(
    holder: EngineHolder,
    ref: ModelRef,
    plan: Plan,
    overrides: Overrides,
    server: Any,
    embeddings: str | None = None,
    prompt_cache: PromptCache | None = None,
) -> None:
    from homelab.models.embeddings import load_serving_engine

    try:
        engine = load_serving_engine(ref, plan, overrides, embeddings, prompt_cache)
    except BaseException as exc:
        holder.failure = exc
        server.should_exit = True
        return
    holder.engine = engine
    logging.getLogger("homelab.server").info(
        "model loaded: %s (%d slots x %d tokens)",
        Path(engine.load_report.model_path).name,
        engine.n_slots,
        engine.n_ctx_per_slot,
    )


def _keys_for(args: argparse.Namespace, keys_path: Path) -> tuple[KeyFile | None, str | None]:
    """The keys file, re-read when it changes (None: no auth, loopback only), and a key
    generated just now, if any."""
    from homelab.server.auth import KeyFile, add_key
    from homelab.server.config import is_loopback

    if keys_path.exists():
        return KeyFile(keys_path), None
    if args.api_key_file is not None:
        from homelab.errors import ConfigError

        raise ConfigError(
            f"{keys_path}: the keys file does not exist.", hint="Create it with --new-key TENANT."
        )
    if is_loopback(args.host):
        return None, None  # local only: like llama.cpp, no key needed
    key = add_key(keys_path, "default", admin=True)
    return KeyFile(keys_path), key


def _remove_keys(args: argparse.Namespace, keys_path: Path) -> int:
    """Remove a tenant's keys; its saved prompt states go too (by the running server, when
    there is one: it owns the folder and notices the keys file change)."""
    from homelab.engine.prompt_cache.store import delete_folder_states
    from homelab.lock import running_server
    from homelab.server.auth import remove_keys

    tenant = remove_keys(keys_path, args.remove_keys)
    running = running_server()
    if running is None:
        deleted = delete_folder_states(prompt_cache_cli.cache_folder(), tenant.identity, None)
        then = f"its {deleted} saved prompt states deleted"
    else:
        then = f"the server at {running.url} deletes what it keeps for it (if it uses {keys_path})"
    if args.json:
        print(json.dumps({"tenant": tenant.name, "keys_file": str(keys_path), "then": then}))
    else:
        print(f"Removed every key of tenant '{tenant.name}' from {keys_path}; {then}.")
    return 0


def _announce_key(args: argparse.Namespace, keys_path: Path, tenant: str, key: str) -> None:
    if args.json:
        print(
            json.dumps({"tenant": tenant, "api_key": key, "keys_file": str(keys_path)}), flush=True
        )
        return
    print(
        f"New API key for tenant '{tenant}' (shown once; only its hash is stored in {keys_path}):"
    )
    print(f"  {key}", flush=True)


def _announce_start(
    args: argparse.Namespace,
    config: ServerConfig,
    keys_path: Path,
    new_key: str | None,
    plan: Plan,
) -> None:
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{host}:{config.port}/v1"
    if args.json:
        doc: dict[str, Any] = {
            "base_url": url,
            "model": config.model_id,
            "auth": config.keys is not None,
            "context_per_request": plan.settings.n_ctx_per_slot,
            "slots": plan.settings.n_parallel,
        }
        if new_key:
            doc.update(api_key=new_key, tenant="default", keys_file=str(keys_path))
        print(json.dumps(doc), flush=True)
        return
    if new_key:
        _announce_key(args, keys_path, "default", new_key)
    auth = "API keys required" if config.keys is not None else "no API key needed (loopback only)"
    print(
        f"Serving {config.model_id} at {url} ({auth}); the model is loading "
        "(/health answers 503 until it is loaded).",
        flush=True,
    )
    print(_agent_context_line(plan), flush=True)


def _agent_context_line(plan: Plan) -> str:
    """What a coding agent gets: its whole prompt (system, tools, history) must fit one slot."""
    n_ctx = plan.settings.n_ctx_per_slot
    s = plan.settings
    kv = f"K/V {s.type_k}/{s.type_v}"
    line = f"Context per request: {n_ctx:,} tokens ({s.n_parallel} slot(s), {kv})."
    if n_ctx < AGENT_MIN_CONTEXT:
        line += (
            f" Coding agents need about {AGENT_MIN_CONTEXT // 1024}K for their tool prompts; "
            "try --goal agent."
        )
    return line


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("homelab")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
