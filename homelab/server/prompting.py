"""One chat preparation for every chat-style dialect.

Chat Completions, the Responses API and Anthropic's Messages API each map their wire request
(each in its own module's ``chat_inputs``) into :class:`ChatInputs` (messages in the
template's shape, tools, tool choice, answer format, thinking switches, a prefill) and
:class:`~homelab.server.serving.SamplingKnobs`, and call :func:`prepare_chat`, which runs
the one chain::

    template present? -> tools offered? -> grammar (forced call / JSON answer)
    -> thinking switches -> render (bounded, off the loop when long) -> tokenize (bounded)
    -> reply format (reasoning split, tool parsing, stop sequences) -> completion budget
    -> sampling per choice

and returns a :class:`PreparedChat`: the prompt tokens, the sampling of each choice and how
to parse the replies. Each dialect then only shapes the parsed reply into its wire format.
Errors carry chat's parameter names (``messages``, ``tools``, ``tool_choice``,
``response_format``, ``max_tokens``); the Responses route renames them to its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import anyio.to_thread

from homelab.engine.api import SamplingParams
from homelab.engine.grammar import JSON_OBJECT_GRAMMAR, schema_to_grammar
from homelab.engine.image_prompt import ImagePrompt
from homelab.errors import EngineError
from homelab.images.decoded import DecodedImage
from homelab.server.chat_images import (
    has_images,
    no_images_here,
    tokenize_with_images,
    with_markers,
)
from homelab.server.engine_seam import EngineLike, TemplateLike
from homelab.server.errors import context_length_exceeded, invalid_request, prompt_too_long
from homelab.server.history import (
    stable_messages,
    wants_object_arguments,
    wants_thinking_field,
    with_object_arguments,
    with_thinking_field,
)
from homelab.server.reasoning import THINK_CLOSE, THINK_OPEN, after_thought, thinking_switches
from homelab.server.replies import ReplyFormat, split_format
from homelab.server.serving import (
    INLINE_CHARS,
    INLINE_TURNS,
    Prompt,
    RequestContext,
    SamplingKnobs,
    max_tokens_for,
    off_the_loop_when_long,
    preparation_lane,
    sampling_params,
    tokenize,
)
from homelab.server.tools import ToolSet, detect_tool_format, forced_call_grammar

AnswerFormat = Literal["text", "json_object", "json_schema"]
NO_TEMPLATE = "This model has no chat template; use /v1/completions."


@dataclass(frozen=True)
class ChatInputs:
    """A chat request in the chat template's terms, whatever dialect it came in."""

    messages: list[dict[str, Any]]  # role, content, tool_calls, tool_call_id, reasoning_content
    tools: list[dict[str, Any]] | None = None  # OpenAI function tools (chat's shape)
    tool_choice: str | None = None  # None | "none" | "auto" | "required" | "function:NAME"
    answer_format: AnswerFormat = "text"
    answer_schema: Mapping[str, Any] | None = None  # for "json_schema"
    prefill: str = ""  # a final assistant turn that the reply continues (Anthropic)
    template_kwargs: Mapping[str, Any] | None = None  # chat_template_kwargs
    enable_thinking: bool | None = None
    reasoning_effort: str | None = None
    reasoning_format: str | None = None  # the request's own choice over the server's
    reply_stops: tuple[str, ...] = ()  # stop sequences matched in the parsed answer

    @property
    def forced_call(self) -> bool:
        choice = self.tool_choice or ""
        return choice == "required" or choice.startswith("function:")


@dataclass(frozen=True)
class RenderedChat:
    """A conversation rendered by the model's template and tokenized."""

    text: str  # the prompt, prefill included
    tokens: tuple[int, ...]
    tools: list[dict[str, Any]] | None  # as rendered (None: no tools, none parsed)
    template: TemplateLike
    opened: bool  # the prompt leaves a <think> block open: the reply starts inside it
    images: ImagePrompt | None = None  # a chat with images (then ``tokens`` are its tokens)

    @property
    def n_prompt_tokens(self) -> int:
        """The prompt's tokens as the model counts them (an image's tokens included)."""
        return self.images.n_cells if self.images is not None else len(self.tokens)


@dataclass(frozen=True)
class PreparedChat:
    """Ready to submit: the prompt, each choice's sampling, how to parse the replies."""

    rendered: RenderedChat
    reply: ReplyFormat
    sampling_for: Callable[[int, Prompt], SamplingParams]

    @property
    def prompt(self) -> Prompt:
        return Prompt(self.rendered.tokens, self.rendered.text, self.rendered.images)


Budget = Literal["refuse", "clamp"]  # a max_tokens beyond the room left: 400, or the room


async def prepare_chat(
    ctx: RequestContext,
    inputs: ChatInputs,
    knobs: SamplingKnobs,
    max_tokens: int | None,
    budget: Budget = "refuse",
) -> PreparedChat:
    """Everything checked, rendered and tokenized, in the one order every dialect shares."""
    template = require_template(ctx.engine)
    tools = offered_tools(inputs, template)
    # a schema's conversion costs its size (up to the bounds): never on the event loop
    grammar = await anyio.to_thread.run_sync(output_grammar, inputs, tools, template)
    rendered = await _rendered(ctx, inputs, template, tools)
    reply = _reply_format(ctx, inputs, rendered)
    if grammar is not None and reply.opened:  # the reply starts inside <think>: let it think
        grammar = after_thought(grammar)
    completion_tokens = _completion_budget(
        ctx, max_tokens, rendered.n_prompt_tokens, budget, knobs.min_tokens
    )
    n_vocab = ctx.engine.model_info.n_vocab

    def sampling_for(index: int, _: Prompt) -> SamplingParams:
        return sampling_params(
            knobs,
            max_tokens=completion_tokens,
            n_vocab=n_vocab,
            grammar=grammar,
            choice_index=index,
        )

    return PreparedChat(rendered, reply, sampling_for)


async def render_chat(ctx: RequestContext, inputs: ChatInputs) -> RenderedChat:
    """The prompt alone (``count_tokens``): template, tools and thinking switches applied."""
    template = require_template(ctx.engine)
    return await _rendered(ctx, inputs, template, offered_tools(inputs, template))


def require_template(engine: EngineLike) -> TemplateLike:
    template = engine.chat_template
    if template is None:
        raise invalid_request(NO_TEMPLATE, param="messages")
    return template


def offered_tools(inputs: ChatInputs, template: TemplateLike) -> list[dict[str, Any]] | None:
    """Tools to render into the prompt (None: render and parse none)."""
    if not inputs.tools or inputs.tool_choice == "none":
        return None
    if not template.supports_tools:
        raise invalid_request("This model's chat template does not support tools.", param="tools")
    names = {tool["function"]["name"] for tool in inputs.tools}
    choice = inputs.tool_choice or ""
    if choice.startswith("function:") and choice[9:] not in names:
        raise invalid_request(
            f"tool_choice names '{choice[9:]}', which is not in tools.", param="tool_choice"
        )
    return inputs.tools


def output_grammar(
    inputs: ChatInputs, tools: list[dict[str, Any]] | None, template: TemplateLike
) -> str | None:
    """The grammar the reply must follow: a forced tool call, or a JSON answer, or none."""
    if tools and inputs.forced_call:
        if inputs.answer_format != "text":
            raise invalid_request(
                "response_format cannot be combined with a forced tool_choice.",
                param="response_format",
            )
        choice = inputs.tool_choice or ""
        only = choice[9:] if choice.startswith("function:") else None
        tool_format = detect_tool_format(template.source).format
        return _grammar_or_400(lambda: forced_call_grammar(tools, only, tool_format), "tools")
    if inputs.answer_format == "json_object":
        return JSON_OBJECT_GRAMMAR
    if inputs.answer_format == "json_schema":
        schema = inputs.answer_schema or {}
        return _grammar_or_400(lambda: schema_to_grammar(schema), "response_format")
    return None


def _grammar_or_400(make: Callable[[], str], param: str) -> str:
    try:
        return make()
    except EngineError as exc:
        raise invalid_request(f"Unusable JSON schema: {exc}", param=param) from exc


async def _rendered(
    ctx: RequestContext,
    inputs: ChatInputs,
    template: TemplateLike,
    tools: list[dict[str, Any]] | None,
) -> RenderedChat:
    switches = thinking_switches(
        template.source,
        inputs.template_kwargs,
        enable_thinking=inputs.enable_thinking,
        reasoning_effort=inputs.reasoning_effort,
        default_enable_thinking=ctx.config.enable_thinking,
    )
    work = partial(_template_messages, ctx, inputs, template)
    messages, images = await off_the_loop_when_long(ctx, work, len(inputs.messages))
    base = await render_messages(ctx, template, messages, tools, switches)
    text = base + inputs.prefill
    opened = base.rstrip().endswith(THINK_OPEN) and THINK_CLOSE not in inputs.prefill
    if images:
        prompt = await tokenize_with_images(ctx.engine, text, images)
        return RenderedChat(text, prompt.tokens, tools, template, opened, prompt)
    tokens = await tokenize(ctx.engine, text, add_bos=True)  # the engine drops a doubled BOS
    return RenderedChat(text, tokens, tools, template, opened)


def _template_messages(
    ctx: RequestContext, inputs: ChatInputs, template: TemplateLike
) -> tuple[list[dict[str, Any]], list[DecodedImage]]:
    """The messages as this template takes them (images as markers, volatile text out,
    the family's shapes), and the images in order."""
    config = ctx.config
    messages, images = _image_parts_as_markers(ctx.engine, inputs.messages)
    messages = stable_messages(messages, config.volatile_patterns, config.history_reasoning)
    if wants_object_arguments(template.source):  # GLM: arguments.items()
        messages = with_object_arguments(messages)
    if wants_thinking_field(template.source):  # gpt-oss
        messages = with_thinking_field(messages)
    return messages, images


def _image_parts_as_markers(
    engine: EngineLike, messages: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[DecodedImage]]:
    """Image parts as the projector's marker in the text (the template renders text), and
    the images in order; 400 naming the model when it takes no images."""
    if not has_images(messages):
        return messages, []
    marker = engine.image_marker
    if marker is None:
        raise no_images_here(engine.model_info.name)
    return with_markers(messages, marker)


def _reply_format(ctx: RequestContext, inputs: ChatInputs, rendered: RenderedChat) -> ReplyFormat:
    reasoning = split_format(
        rendered.template, ctx.config.reasoning_format, inputs.reasoning_format
    )
    return ReplyFormat.for_prompt(
        ctx.engine,
        reasoning,
        rendered.text,
        parse_tools=rendered.tools is not None,
        tool_format=detect_tool_format(rendered.template.source).format,
        tools=ToolSet.of(rendered.tools),
        stops=inputs.reply_stops,
        opened=rendered.opened and reasoning is not None and reasoning.style == "think",
    )


def _completion_budget(
    ctx: RequestContext, requested: int | None, prompt_tokens: int, budget: Budget, min_tokens: int
) -> int:
    if budget == "refuse":
        default = ctx.config.default_max_tokens
        return max_tokens_for(ctx, requested, default, prompt_tokens, min_tokens)
    n_ctx = ctx.engine.n_ctx_per_slot
    room = n_ctx - prompt_tokens
    if room < 1:
        raise context_length_exceeded(prompt_tokens, 1, n_ctx)
    wanted = ctx.config.default_max_tokens if requested is None else requested
    return max(1, min(wanted, room, ctx.config.max_tokens_limit or room))  # 0: one, unsent


# --- rendering -------------------------------------------------------------------------------


async def render_messages(
    ctx: RequestContext,
    template: TemplateLike,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    switches: Mapping[str, Any],
) -> str:
    """The prompt for template-shaped messages (``switches``: extra template variables such
    as ``enable_thinking``); a template's refusal is a 400. A short chat is rendered on the
    event loop; a long one (its turns or its text) in the tenant's preparation lane."""

    def run(chars: int) -> str:
        if chars > ctx.engine.n_ctx_per_slot:
            refuse_user_text_beyond_context(ctx.engine, messages)
        return template.render(messages, tools=tools, add_generation_prompt=True, **switches)

    def text_chars() -> int:
        return sum(len(m["content"]) for m in messages)

    try:
        if len(messages) <= INLINE_TURNS:
            chars = text_chars()
            if chars + len(str(tools or "")) <= INLINE_CHARS:
                return run(chars)
        lane = preparation_lane(ctx.http.scope)
        return await anyio.to_thread.run_sync(lambda: run(text_chars()), limiter=lane)
    except EngineError as exc:  # the template refused these messages (e.g. roles must alternate)
        raise invalid_request(str(exc), param="messages") from exc


def refuse_user_text_beyond_context(engine: EngineLike, messages: Sequence[dict[str, Any]]) -> None:
    """Refuse before rendering (about 25 µs a message) a chat whose user messages alone cannot
    fit: every template renders each user message's text (at most trimmed), and no token
    stands for more than ``longest_token_bytes`` of it. Other roles are left out: some
    templates drop parts of them (earlier turns' reasoning, a system message)."""
    longest = engine.longest_token_bytes
    if not longest:
        return
    size = sum(len(m["content"].strip().encode()) for m in messages if m["role"] == "user")
    at_least = -(-size // longest)
    limit = engine.n_ctx_per_slot - 1
    if at_least > limit:
        detail = (
            f"the user messages' {size} bytes alone are at least {at_least} tokens, "
            f"more than the {limit} that fit"
        )
        raise prompt_too_long(engine.n_ctx_per_slot, detail)
